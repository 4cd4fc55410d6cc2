"""Exceptions carrying the daemon's status code and message.

Every failure of a call raises a PageallocError subclass chosen by the
canonical status code (the numbers absl::StatusCode and gRPC share), with
`.code` (a StatusCode: `.name` "RESOURCE_EXHAUSTED", int value 8) and
`.message` (the daemon's message, or the client library's). Some classes
also derive from the built-in exception a Python caller expects:
InvalidArgumentError is a ValueError, DeadlineExceededError a
TimeoutError, PermissionDeniedError a PermissionError.

A request refused inside an allocation call is not raised: the
Allocation says which requests were refused (RequestResult.error holds the
exception object) and Allocation.check() raises the first refusal.
"""

import enum


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class PageallocError(Exception):
    """A call failed; `.code` is its StatusCode, `.message` why."""

    code = StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        if code is not None:
            self.code = StatusCode(code)
        self.message = message
        super().__init__("%s: %s" % (self.code.name, message))


class CancelledError(PageallocError):
    code = StatusCode.CANCELLED


class UnknownError(PageallocError):
    code = StatusCode.UNKNOWN


class InvalidArgumentError(PageallocError, ValueError):
    code = StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(PageallocError, TimeoutError):
    code = StatusCode.DEADLINE_EXCEEDED


class NotFoundError(PageallocError):
    code = StatusCode.NOT_FOUND


class AlreadyExistsError(PageallocError):
    code = StatusCode.ALREADY_EXISTS


class PermissionDeniedError(PageallocError, PermissionError):
    code = StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(PageallocError):
    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(PageallocError):
    code = StatusCode.FAILED_PRECONDITION


class AbortedError(PageallocError):
    code = StatusCode.ABORTED


class OutOfRangeError(PageallocError):
    code = StatusCode.OUT_OF_RANGE


class UnimplementedError(PageallocError):
    code = StatusCode.UNIMPLEMENTED


class InternalError(PageallocError):
    code = StatusCode.INTERNAL


class UnavailableError(PageallocError):
    code = StatusCode.UNAVAILABLE


class DataLossError(PageallocError):
    code = StatusCode.DATA_LOSS


class UnauthenticatedError(PageallocError):
    code = StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
    NotFoundError, AlreadyExistsError, PermissionDeniedError,
    ResourceExhaustedError, FailedPreconditionError, AbortedError,
    OutOfRangeError, UnimplementedError, InternalError, UnavailableError,
    DataLossError, UnauthenticatedError)}


def error_for(code, message):
    """The exception (not raised) for a nonzero status code."""
    try:
        status = StatusCode(code)
    except ValueError:
        return UnknownError("status code %d: %s" % (code, message))
    return _BY_CODE[status](message)
