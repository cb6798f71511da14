"""`nanovllm viz`: watch the engine work, step by step, in the terminal.

Installed as `nanovllm.viz` (the folder is `viz/` at the top of the repository). It consumes the
engine's typed events (`nanovllm.events`) and nothing else:

    state.py      the pure reducer: events -> VizState (no Textual, no engine internals)
    trace.py      record / replay event traces (JSON lines)
    scenarios.py  built-in engine configurations and workloads, one per effect to show
    driver.py     the worker that owns the engine (or a trace) and takes commands from the UI
    app.py        the Textual app; widgets/ its views, screens/ its modal screens, app.tcss
    cli.py        the `nanovllm viz` subcommand

Importing this package is cheap: Textual and torch load only when the app or the engine starts.
"""
