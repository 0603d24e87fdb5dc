"""Who may read the dashboard, and how that credential stays out of logs (issue 46).

The run's token authorizes Stop, Fetch and pushes on the gRPC plane; the dashboard only shows state.
So the dashboard never takes the token. It takes a *view credential* derived from it,

    view = HMAC-SHA256(token, "ddiloco-dashboard-view")   (hex)

which reads the page and its JSON and nothing else: knowing it gives no way back to the token, and a
view URL shared with a colleague or left in a browser's history cannot stop the run. Being derived, it
is the same for every process of a run (a hand-started synchronizer's dashboard, `ddiloco run`'s),
with nothing more to hand out. It is sent as the `X-Ddiloco-View` header or `?view=` in the page's
address (the URL printed once at the start, also kept in the run directory's `dashboard.url`, mode
0600). Any credential in a request line is redacted before the line is logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path
from urllib.parse import quote

VIEW_HEADER = "X-Ddiloco-View"
VIEW_PARAM = "view"
_CREDENTIAL = re.compile(r"(?i)((?:^|[?&;])(?:token|view)=)[^&;\s#\"]*")


def view_credential(token: str) -> str:
    """The read-only credential of the dashboard of a run whose token is `token`."""
    return hmac.new(token.encode(), b"ddiloco-dashboard-view", hashlib.sha256).hexdigest()


def view_url(base: str, view: str | None) -> str:
    """The address the user opens: the base URL, with the view credential when there is one."""
    return base if view is None else f"{base}?{VIEW_PARAM}={quote(view, safe='')}"


def redact(text: str) -> str:
    """`text` (a request line, a URL) with the value of every `token=` and `view=` replaced."""
    return _CREDENTIAL.sub(r"\1<redacted>", text)


def write_url_file(path: Path, url: str) -> None:
    """`dashboard.url`, readable by its owner only: it holds the view credential."""
    path.unlink(missing_ok=True)  # an earlier run's file may have other modes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(url + "\n")
