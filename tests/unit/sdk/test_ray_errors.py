"""Ray's ``RayTaskError`` as a handle caller receives it: an instance of both ``RayTaskError``
and the callee's exception class, its text the callee's traceback, one cause through a chain of
calls, and picklable (a callee lets it through to its own caller; a driver may keep it)."""

from __future__ import annotations

import pickle
import threading

import pytest

from kubeserve.sdk.ray_errors import RayError, RayTaskError, task_error


class NeedsTwo(Exception):
    def __init__(self, first: str, second: int) -> None:
        super().__init__(first, second)
        self.second = second


def _raised(exc: BaseException, where: str) -> RayTaskError:
    """What a callee named ``where`` sends back after ``exc`` was raised in it (over the wire)."""
    try:
        raise exc
    except BaseException as raised:
        return pickle.loads(
            pickle.dumps(task_error(raised, where, actor_repr="<r>", actor_id="r1"))
        )


def check_input(value: int) -> None:
    raise ValueError(f"negative value: {value}")


def test_the_error_is_both_ray_task_error_and_the_causes_class() -> None:
    try:
        check_input(-1)
    except ValueError as exc:
        sent = pickle.loads(pickle.dumps(task_error(exc, "ServeReplica:app:Checker.check")))
    error = sent.as_instanceof_cause()
    assert isinstance(error, RayTaskError) and isinstance(error, ValueError)
    assert type(error).__name__ == "RayTaskError(ValueError)"
    assert isinstance(error.cause, ValueError) and error.cause.args == ("negative value: -1",)
    text = str(error)
    assert text.startswith("kubeserve::ServeReplica:app:Checker.check() (pid=")
    assert ", in check_input" in text and text.endswith("ValueError: negative value: -1")
    with pytest.raises(ValueError, match="negative value"):
        raise error


def test_the_causes_attributes_are_read_through() -> None:
    error = _raised(NeedsTwo("a", 2), "f").as_instanceof_cause()
    assert isinstance(error, NeedsTwo) and error.second == 2


def test_a_chain_keeps_the_innermost_cause_and_every_traceback() -> None:
    inner = _raised(ValueError("deep"), "ServeReplica:app:Inner.f").as_instanceof_cause()
    outer = _raised(inner, "ServeReplica:app:Outer.g").as_instanceof_cause()
    assert type(outer) is type(inner)  # one class per cause class
    assert type(outer.cause) is ValueError and outer.cause.args == ("deep",)
    text = str(outer)
    assert "Outer.g()" in text and "Inner.f()" in text and "ValueError: deep" in text


def test_the_callers_error_pickles() -> None:
    error = _raised(KeyError("k"), "f").as_instanceof_cause()
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert isinstance(again, KeyError) and again.cause.args == ("k",)


def test_an_unpicklable_cause_is_replaced_by_a_ray_error_saying_so() -> None:
    class Holder(Exception):
        def __init__(self) -> None:
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    error = _raised(Holder(), "f")
    assert type(error.cause) is RayError and "isn't serializable" in str(error.cause)


def test_a_cause_ray_task_error_already_covers_is_not_subclassed() -> None:
    plain = _raised(Exception("plain"), "f")
    assert plain.as_instanceof_cause() is plain
