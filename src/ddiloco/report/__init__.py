"""Seeing a finished run: plots and a self-contained HTML page from one or more run directories
(`ddiloco report`), read through `records.rundir`; several runs are overlaid for comparison.

    timeline    learner up/down intervals and merges, from either driver's event log
    plots       the figures (matplotlib, no display needed)
    page        the HTML page that embeds them with each run's summary
"""
