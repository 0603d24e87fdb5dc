"""A script that never configures logging still sees ddiloco's records after one call."""

import logging

import pytest

import ddiloco


def test_log_to_stderr_shows_ddiloco_records_once_and_leaves_the_root_alone(capsys):
    root_handlers = list(logging.getLogger().handlers)
    logger = logging.getLogger("ddiloco")
    before = list(logger.handlers)
    try:
        first = ddiloco.log_to_stderr()
        second = ddiloco.log_to_stderr("warning")
        assert first is second and len(logger.handlers) == len(before) + 1
        assert logging.getLogger().handlers == root_handlers
        first.stream = __import__("sys").stderr  # capsys swapped stderr after the handler was made
        logging.getLogger("ddiloco.learner.client").info("hidden at warning")
        logging.getLogger("ddiloco.learner.client").warning("shown")
        err = capsys.readouterr().err
        assert "shown" in err and "hidden" not in err
        with pytest.raises(ValueError, match="log level"):
            ddiloco.log_to_stderr("loud")
    finally:
        logger.handlers[:] = before
        logger.setLevel(logging.NOTSET)
