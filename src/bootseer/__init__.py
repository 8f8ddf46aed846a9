"""bootseer: make large training jobs start fast.

Public API only; subsystems live in their own packages (store, trace, ...).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
