"""Tests of loadertune.channel: JSON lines over a socket pair."""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadertune.trials.channel import Channel
from loadertune.trials.messages import STOP, EndedMsg, EventMsg, FailureMsg


@pytest.fixture
def ends() -> Iterator[tuple[Channel, Channel, socket.socket]]:
    """This end, the other end as a Channel, and the other end's raw socket."""
    ours, theirs = Channel.pair()
    other = Channel(theirs)
    yield ours, other, theirs
    ours.close()
    other.close()


def _line(msg: dict[str, object]) -> bytes:
    return (json.dumps(msg) + "\n").encode()


def test_pair_gives_an_inheritable_socket_for_the_child() -> None:
    ours, theirs = Channel.pair()
    try:
        assert theirs.get_inheritable() is True
        assert ours.closed is False
    finally:
        ours.close()
        theirs.close()


def test_send_and_recv_both_ways(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, other, _ = ends
    msg = {"t": "progress", "i": 3, "rate": 1234.5, "nested": {"a": [1, 2, None]}, "ok": True}
    assert other.send(msg) is True
    assert ours.recv(timeout=5) == msg
    assert ours.send({"t": "stop"}) is True
    assert other.recv(timeout=5) == {"t": "stop"}


def test_typed_messages_travel_as_plain_dicts(
    ends: tuple[Channel, Channel, socket.socket],
) -> None:
    ours, other, _ = ends
    sent = [
        EventMsg(t="event", name="window_start", bus_id=None),
        FailureMsg(t="failure", where="loader", num_workers=2, text="x", traceback="tb"),
        EndedMsg(t="ended", how="the script ended", iterated=True),
    ]
    for msg in sent:
        other.send(msg)
    assert ours.drain() == sent
    ours.send(STOP)
    assert other.recv(timeout=5) == {"t": "stop"}


def test_messages_arrive_in_order(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, other, _ = ends
    for i in range(5):
        other.send({"i": i})
    assert [ours.recv(timeout=5) for _ in range(5)] == [{"i": i} for i in range(5)]


def test_send_special_values(ends: tuple[Channel, Channel, socket.socket]) -> None:
    """Non-finite floats pass; what JSON cannot hold is sent as text."""
    ours, other, _ = ends
    other.send({"nan": math.nan, "inf": math.inf, "path": Path("/tmp/x"), "text": "äö ✓"})
    msg = ours.recv(timeout=5)
    assert msg is not None
    assert math.isnan(msg["nan"])
    assert msg["inf"] == math.inf
    assert msg["path"] == "/tmp/x"
    assert msg["text"] == "äö ✓"


def test_recv_timeout_returns_none(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, _, _ = ends
    assert ours.recv(timeout=0.05) is None
    assert ours.recv(timeout=0) is None
    assert ours.closed is False  # a timeout is not a close


def test_drain_returns_all_queued_messages(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, other, _ = ends
    sent = [{"t": "event", "name": n} for n in ("first_batch", "window_start", "beat")]
    for msg in sent:
        other.send(msg)
    assert ours.drain() == sent
    assert ours.drain() == []


def test_drain_with_nothing_queued(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, _, _ = ends
    assert ours.drain() == []


def test_recv_after_other_side_closed(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, other, _ = ends
    other.send({"t": "last"})
    other.close()
    assert ours.recv(timeout=5) == {"t": "last"}  # what was sent before the close still arrives
    assert ours.recv(timeout=5) is None
    assert ours.closed is True
    assert ours.recv(timeout=5) is None  # and stays so
    assert ours.drain() == []


def test_send_after_other_side_closed(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, other, _ = ends
    other.close()
    assert ours.send({"t": "stop"}) is False
    assert ours.closed is True


def test_message_split_over_two_sends_is_reassembled(
    ends: tuple[Channel, Channel, socket.socket],
) -> None:
    ours, _, theirs = ends
    data = _line({"t": "result", "measurement": {"samples_per_s": 1000.0, "n": list(range(20))}})
    theirs.sendall(data[:7])
    assert ours.recv(timeout=0.05) is None  # half a message is not a message
    theirs.sendall(data[7:])
    assert ours.recv(timeout=5) == json.loads(data)


def test_two_messages_in_one_send(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, _, theirs = ends
    theirs.sendall(_line({"a": 1}) + _line({"b": 2})[:3])
    assert ours.recv(timeout=5) == {"a": 1}
    assert ours.recv(timeout=0.05) is None
    theirs.sendall(_line({"b": 2})[3:] + _line({"c": 3}))
    assert ours.drain() == [{"b": 2}, {"c": 3}]


def test_large_message(ends: tuple[Channel, Channel, socket.socket]) -> None:
    """A message longer than one read (64 KiB) arrives whole."""
    ours, other, _ = ends
    msg = {"traceback": "x" * 300_000}
    sent: list[bool] = []
    sender = threading.Thread(target=lambda: sent.append(other.send(msg)))  # may fill the buffer
    sender.start()
    got = None
    for _ in range(100):  # polled, as the search does; a partial message waits in the buffer
        got = ours.recv(timeout=0.1)
        if got is not None:
            break
    sender.join(timeout=5)
    assert sent == [True]
    assert got == msg


def test_recv_waits_for_the_rest_of_a_message_within_timeout(
    ends: tuple[Channel, Channel, socket.socket],
) -> None:
    ours, _, theirs = ends
    data = _line({"t": "result", "n": 1})
    theirs.sendall(data[:5])
    rest = threading.Timer(0.5, theirs.sendall, args=(data[5:],))
    rest.start()
    try:
        got = ours.recv(timeout=10)
    finally:
        rest.join()
    assert got == {"t": "result", "n": 1}


def test_from_fd(ends: tuple[Channel, Channel, socket.socket]) -> None:
    ours, _, theirs = ends
    child = Channel.from_fd(theirs.dup().detach())
    try:
        child.send({"t": "hello"})
        assert ours.recv(timeout=5) == {"t": "hello"}
    finally:
        child.close()
