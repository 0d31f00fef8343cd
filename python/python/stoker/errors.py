"""The exceptions Stoker raises; every one is a :class:`StokerError`.

``ConfigError`` covers settings and requests the coordinator refuses (an unknown dataset, a
rank outside the world size, a bad transform argument); ``ResumeError`` a ``state_dict`` that
does not fit the job; ``ConnectionError`` a coordinator or worker that cannot be reached;
``TimeoutError`` no batch within the loader's ``timeout``.
"""

from stoker._stoker import (
    ConfigError,
    ConnectionError,
    ResumeError,
    StokerError,
    TimeoutError,
)

__all__ = ["StokerError", "ConfigError", "ResumeError", "ConnectionError", "TimeoutError"]
