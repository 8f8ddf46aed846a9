"""Installs bootseer's zero-code trace capture when BOOTSEER_TRACE_AUTO=1 (put this
directory on PYTHONPATH). Silent on any failure: it must never break a program."""
import os

if os.environ.get("BOOTSEER_TRACE_AUTO") == "1":
    try:
        from bootseer.trace import auto as _auto
        _auto.install()
    except Exception:
        pass
