"""mindrouter: one fair-share endpoint in front of a lab's inference servers."""

__version__ = "0.1.0"
__all__ = ["__version__"]
