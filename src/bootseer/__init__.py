"""bootseer: make large training jobs start fast.

Public API only; subsystems live in their own packages (store, trace, ...).

    import bootseer
    bootseer.ready()   # the job can train: marks ready, creates $BOOTSEER_READY_FILE
"""

__version__ = "0.1.0"

__all__ = ["__version__", "ready"]


def ready() -> None:
    """Say the job is ready (it can train): a ``ready`` mark in the trace, and the file
    named by ``$BOOTSEER_READY_FILE`` created, which closes ``bootseer run``'s hot-block
    recording window. Only the first call in a process counts; harmless outside bootseer
    run. (In an image without bootseer: ``from bootseer_shim import ready``.)"""
    from bootseer.trace.auto import ready as _ready
    _ready()
