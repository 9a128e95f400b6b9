"""The package version, in a module of its own so that every module can import it."""

__version__ = "0.1.0"
