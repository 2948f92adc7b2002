"""Composing a fake server from parts: its attributes that live on its state part."""

from __future__ import annotations

from typing import Any, Generic, Protocol, Self, TypeVar, cast, overload

T = TypeVar("T")


class HasState(Protocol):
    """A fake server that holds its data in one ``state`` part."""

    @property
    def state(self) -> Any:
        """The part that holds the server's data."""


class StateField(Generic[T]):
    """An attribute of a fake server read from and written to the same name on its ``state``.

    Lets tests keep using ``fake.calls`` or set ``fake.upload_limit`` while the
    data lives in one state object that every part of the fake shares.
    """

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, obj: HasState, owner: type[Any]) -> T: ...

    def __get__(self, obj: HasState | None, owner: type[Any]) -> Self | T:
        if obj is None:
            return self
        return cast(T, getattr(obj.state, self._name))

    def __set__(self, obj: HasState, value: T) -> None:
        setattr(obj.state, self._name, value)
