"""Exception classes. Each kind also inherits the matching builtin, so callers can
catch either ``scalefree.PeerLostError`` or ``ConnectionError``."""


class ScalefreeError(Exception):
    """Base class of every error raised by scalefree."""


class PeerLostError(ScalefreeError, ConnectionError):
    """A peer rank exited or was killed while this rank depended on it."""


class ScalefreeTimeoutError(ScalefreeError, TimeoutError):
    """A wait ran past its deadline while every peer was still alive."""


class InvalidArgumentError(ScalefreeError, ValueError):
    """An argument cannot work: bad dtype, shape, offset, non-contiguous array..."""


class MismatchError(ScalefreeError, ValueError):
    """Ranks called the same collective with different sizes, dtypes or ops."""


class BootstrapError(ScalefreeError, RuntimeError):
    """The ranks of a job could not find each other (environment, token, rendezvous)."""


class UnsupportedError(ScalefreeError, NotImplementedError):
    """This backend or platform cannot do what was asked."""


class TransportIOError(ScalefreeError, OSError):
    """An operating-system call of the transport failed."""


class OutOfBudgetError(ScalefreeError, MemoryError):
    """A flash computation cannot run within its memory budget."""


class FlashIOError(ScalefreeError, OSError):
    """Reading or writing a flash file failed (the message names the file)."""


class NoConvergenceError(ScalefreeError, RuntimeError):
    """An iterative solver (the block Krylov-Schur eigensolver behind ``flash.svds``) stopped
    after its iteration limit with fewer than the requested converged pairs. ``eigenvalues``
    and ``eigenvectors`` hold the converged ones (possibly none)."""

    def __init__(self, msg, eigenvalues=None, eigenvectors=None):
        super().__init__(msg)
        self.eigenvalues = eigenvalues
        self.eigenvectors = eigenvectors


class DataError(ScalefreeError, ValueError):
    """Bad input data (e.g. a malformed rating file); the message names the file and line."""


__all__ = [
    "ScalefreeError",
    "PeerLostError",
    "ScalefreeTimeoutError",
    "InvalidArgumentError",
    "MismatchError",
    "BootstrapError",
    "UnsupportedError",
    "TransportIOError",
    "OutOfBudgetError",
    "FlashIOError",
    "NoConvergenceError",
    "DataError",
]
