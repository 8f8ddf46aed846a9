"""bootseer's zero-code trace capture in every Python process started with this directory
on PYTHONPATH and BOOTSEER_TRACE_AUTO=1 (``bootseer run`` sets both, in a container or on
the host). The capture comes from the ``bootseer_shim`` package next to this file when
``bootseer run`` shipped one (the image needs no bootseer), else from bootseer itself.
Then the next ``sitecustomize`` on sys.path (the image's, the distribution's) runs as if
this one were not there. Standard library only; silent on failure: it must never break a
program."""
import os
import sys


def _install_capture():
    try:
        try:
            from bootseer_shim import jobenv
        except ImportError:
            from bootseer import jobenv
        if not jobenv.capture_on():   # the capture is imported only where it is on
            return
        try:
            from bootseer_shim import auto
        except ImportError:
            from bootseer.trace import auto
        auto.install()
    except Exception:  # noqa: BLE001 - silent on failure: it must never break a program
        pass


def _chain():
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - what Python does with a failing sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(e).__name__}: {e}", file=sys.stderr)


_install_capture()
_chain()
