"""The wire formats: the frames of a streamed handle call survive any cut of the byte stream; a
load report's counts."""

from __future__ import annotations

import pytest

from kubeserve.runtime import wire


def test_frames_are_read_back_whatever_the_chunking() -> None:
    frames = [(wire.FRAME_ITEM, wire.encode_result(i)) for i in range(5)] + [(wire.FRAME_END, b"")]
    stream = b"".join(wire.encode_frame(kind, payload) for kind, payload in frames)
    for size in (1, 2, 3, 7, len(stream)):
        reader = wire.FrameReader()
        got = []
        for start in range(0, len(stream), size):
            got.extend(reader.feed(stream[start : start + size]))
        assert got == frames


def test_call_options_travel_with_the_arguments() -> None:
    body = wire.encode_call((1,), {"k": 2}, {"model_id": "m"})
    assert wire.decode_call_with_options(body) == ((1,), {"k": 2}, {"model_id": "m"})
    assert wire.decode_call(body) == ((1,), {"k": 2})
    assert wire.decode_call_with_options(wire.encode_call((), {})) == ((), {}, {})


def test_a_load_reports_counts_are_a_json_object_of_counts_never_negative() -> None:
    assert wire.parse_queued('{"app#D": 3, "app#E": "0"}') == {"app#D": 3, "app#E": 0}
    assert wire.split_deployment_key(wire.deployment_key("app", "D")) == ("app", "D")
    for bad in ("[1]", "not json", '{"app#D": "x"}', '{"app#D": -1}'):
        with pytest.raises(ValueError):
            wire.parse_queued(bad)
