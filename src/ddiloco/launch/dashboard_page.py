"""The dashboard's one page: plain HTML and a little JavaScript, no build step and nothing fetched
from elsewhere. It polls `state.json` every second and redraws the numbers, the learners' table and
the loss curves (an inline SVG)."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ddiloco run</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.stats span { display: inline-block; margin: 0 1.5em 0.5em 0; }
.stats b { font-size: 1.3em; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border-bottom: 1px solid #ddd; padding: 0.25em 0.8em; text-align: right; }
td.state { text-align: left; }
.running { color: #1a7f37; } .down, .failed, .gone { color: #cf222e; } .starting, .joining, .reconnecting { color: #9a6700; } .left { color: #57606a; }
svg { border: 1px solid #ddd; background: #fafafa; }
#error { color: #cf222e; }
</style></head><body>
<h1>ddiloco: <span id="method">-</span></h1>
<div class="stats">
<span>time <b id="clock">-</b></span>
<span>global version <b id="version">-</b></span>
<span>merges <b id="merges">-</b></span>
<span>tokens <b id="tokens">-</b></span>
<span>goodput <b id="goodput">-</b></span>
<span>longest stall <b id="stall">-</b></span>
<span>eval loss <b id="eval-loss">-</b></span>
<span>learners running <b id="learner-count">-</b></span>
<span>restarts <b id="restarts">-</b></span>
</div>
<div id="error"></div>
<table id="learners"><thead><tr><th>learner</th><th>state</th><th>pid</th><th>restarts</th><th>step</th>
<th>tokens trained</th><th>merged tokens</th><th>train loss</th><th title="overlap: steps a sync overlaps with compute (--overlap auto: 2 + the steps its link takes)">tau</th><th>link s</th></tr></thead><tbody></tbody></table>
<h2>Loss against tokens</h2>
<svg id="curve" width="640" height="260" viewBox="0 0 640 260"></svg>
<p>eval loss of the global model (blue), learners' training loss (orange).
<a href="state.json">state.json</a></p>
<script>
const view = new URLSearchParams(location.search).get("view");
const headers = view ? {"X-Ddiloco-View": view} : {};
const fmt = (x, d) => (x === null || x === undefined) ? "-" : Number(x).toFixed(d);
function line(points, xmax, ymin, ymax, color) {
  if (points.length < 1) return "";
  const xy = points.map(p => [40 + 590 * p[0] / xmax, 240 - 220 * (p[1] - ymin) / Math.max(ymax - ymin, 1e-9)]);
  return `<polyline fill="none" stroke="${color}" stroke-width="2" points="${xy.map(p => p.join(",")).join(" ")}"/>`;
}
function draw(history) {
  const ev = history.filter(h => h.kind === "eval").map(h => [h.tokens, h.eval_loss]);
  const tr = history.filter(h => h.kind === "train").map(h => [h.tokens, h.train_loss]);
  const all = ev.concat(tr);
  if (!all.length) return;
  const xmax = Math.max(...all.map(p => p[0]), 1), ys = all.map(p => p[1]);
  const ymin = Math.min(...ys), ymax = Math.max(...ys);
  document.getElementById("curve").innerHTML =
    `<text x="5" y="15" font-size="11">${ymax.toFixed(2)}</text><text x="5" y="240" font-size="11">${ymin.toFixed(2)}</text>` +
    `<text x="560" y="255" font-size="11">${xmax} tokens</text>` +
    line(tr, xmax, ymin, ymax, "#e07b00") + line(ev, xmax, ymin, ymax, "#1f6feb");
}
async function refresh() {
  try {
    const r = await fetch("state.json", {headers});
    if (!r.ok) throw new Error(r.status + " " + r.statusText);
    const s = await r.json();
    document.getElementById("error").textContent = "";
    document.getElementById("method").textContent = s.method + (s.stopping ? " (stopping)" : "");
    document.getElementById("clock").textContent = fmt(s.elapsed, 0) + " s" + (s.duration ? " / " + s.duration + " s" : "");
    document.getElementById("version").textContent = s.version;
    document.getElementById("merges").textContent = s.merges;
    document.getElementById("tokens").textContent = s.tokens + (s.token_budget ? " / " + s.token_budget : "");
    document.getElementById("goodput").textContent = fmt(s.goodput, 2);
    document.getElementById("stall").textContent = fmt(s.stall_seconds_max, 1) + " s";
    document.getElementById("eval-loss").textContent = fmt(s.eval_loss, 3);
    document.getElementById("learner-count").textContent = s.learners.filter(l => l.state === "running").length;
    document.getElementById("restarts").textContent = s.learner_restarts ?? "-";
    document.querySelector("#learners tbody").innerHTML = s.learners.map(l =>
      `<tr><td>${l.id}</td><td class="state ${l.state}">${l.state}</td><td>${l.pid ?? "-"}</td><td>${l.restarts ?? "-"}</td>` +
      `<td>${l.step ?? "-"}</td><td>${l.tokens_trained || "-"}</td><td>${fmt(l.tokens_merged, 0)}</td>` +
      `<td>${fmt(l.loss, 3)}</td><td>${l.overlap ?? "-"}</td><td>${fmt(l.link_seconds, 3)}</td></tr>`).join("");
    draw(s.history || []);
  } catch (e) {
    document.getElementById("error").textContent = "no answer from the run: " + e.message;
  }
}
refresh();
setInterval(refresh, 1000);
</script></body></html>
"""
