"""Traces of model and tool calls: recording, the file format, and replay with the plan pinned."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import orjson
import pytest

from agentlease import InvalidInput, PlanDiverged
from agentlease.harness.responses import from_anthropic_message, from_openai_chat
from agentlease.harness.trace import (
    TRACE_FORMAT,
    TRACE_VERSION,
    RecordedError,
    Recorder,
    ReplayModel,
    Trace,
    TraceEvent,
    request_of,
)


class Ticks:
    """A clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def llm(prompt: str, *, temperature: float = 0.0) -> dict[str, object]:
    return {"text": f"plan for {prompt}", "temperature": temperature}


async def allm(prompt: str) -> dict[str, object]:
    await asyncio.sleep(0)
    return {"text": f"async plan for {prompt}"}


def lookup(order: int) -> dict[str, object]:
    return {"order": order, "status": "paid"}


async def alookup(order: int) -> list[int]:
    await asyncio.sleep(0)
    return [order, order + 1]


def record_two_tasks(recorder: Recorder) -> None:
    model, amodel = recorder.model(llm), recorder.model(allm, name="claude")
    tool, atool = recorder.tool(lookup), recorder.tool(alookup)
    with recorder.task("a"):
        assert model("refund", temperature=0.5) == {"text": "plan for refund", "temperature": 0.5}
        assert tool(17) == {"order": 17, "status": "paid"}
    with recorder.task("b"):
        assert asyncio.run(amodel("ship")) == {"text": "async plan for ship"}
        assert asyncio.run(atool(3)) == [3, 4]
    with recorder.task("a"):
        model("confirm")


def test_calls_are_recorded_per_task_with_steps_numbered_in_call_order() -> None:
    recorder = Recorder(meta={"scenario": "refund"})
    record_two_tasks(recorder)
    trace = recorder.trace

    assert trace.tasks() == ["a", "b"]
    assert [(e.task, e.step, e.name) for e in trace.model_responses("a")] == [
        ("a", "m1", "llm"),
        ("a", "m2", "llm"),
    ]
    first = trace.model_responses("a")[0]
    assert first.request == {"args": ["refund"], "kwargs": {"temperature": 0.5}}
    assert first.response == {"text": "plan for refund", "temperature": 0.5}
    assert first.error is None
    (b_model,) = trace.model_responses("b")
    assert (b_model.step, b_model.name, b_model.response) == (
        "m1",
        "claude",
        {"text": "async plan for ship"},
    )
    assert [(e.task, e.step, e.name, e.response) for e in trace.tool_calls()] == [
        ("a", "t1", "lookup", {"order": 17, "status": "paid"}),
        ("b", "t1", "alookup", [3, 4]),
    ]
    assert [e.name for e in trace.tool_calls("b")] == ["alookup"]
    assert all(e.started >= 0 and e.elapsed >= 0 for e in trace.events)
    assert [e.started for e in trace.events] == sorted(e.started for e in trace.events)


def test_a_trace_survives_a_file(tmp_path: Path) -> None:
    recorder = Recorder(meta={"scenario": "refund", "seed": 7})
    record_two_tasks(recorder)
    path = tmp_path / "run.trace"
    recorder.save(path)

    loaded = Trace.load(path)
    assert loaded.events == recorder.trace.events
    assert loaded.meta == {"scenario": "refund", "seed": 7}
    header = path.read_bytes().splitlines()[0]
    assert header.startswith(b'{"format":"agentlease-trace","version":1')
    assert Trace.loads(loaded.dumps()).events == loaded.events


def test_timings_come_from_the_recorders_clock() -> None:
    recorder = Recorder(clock=Ticks())  # read at creation (101), call start (102), end (103)
    recorder.model(llm)("x")
    (event,) = recorder.trace.events
    assert (event.started, event.elapsed) == (1.0, 1.0)


def test_explicit_steps_and_the_main_task() -> None:
    recorder = Recorder()
    model, tool = recorder.model(llm), recorder.tool(lookup)
    model("outside")
    with recorder.step("a", "plan"):
        model("p")
        tool(1)
    with recorder.task("a"):
        model("q")
    assert [(e.task, e.step) for e in recorder.trace.events] == [
        ("main", "m1"),
        ("a", "plan"),
        ("a", "plan"),
        ("a", "m2"),  # the second model call of task "a"
    ]
    with pytest.raises(InvalidInput, match="task"), recorder.task(""):
        pass
    with pytest.raises(InvalidInput, match="step"), recorder.step("a", ""):
        pass


def test_an_error_is_recorded_and_raised_unchanged() -> None:
    recorder = Recorder()
    boom = ValueError("rate limited")

    def failing(prompt: str) -> str:
        raise boom

    async def afailing(x: int) -> int:
        raise KeyError(x)

    with recorder.task("a"), pytest.raises(ValueError, match="rate limited") as info:
        recorder.model(failing)("hi")
    assert info.value is boom
    with recorder.task("a"), pytest.raises(KeyError):
        asyncio.run(recorder.tool(afailing)(5))

    model_event, tool_event = recorder.trace.events
    assert (model_event.response, model_event.error) == (
        None,
        {"type": "ValueError", "message": "rate limited"},
    )
    assert tool_event.error == {"type": "KeyError", "message": "5"}


def test_an_error_type_outside_the_builtins_is_module_qualified() -> None:
    recorder = Recorder()

    def fail() -> None:
        raise PlanDiverged("a", "m1", 0)

    with pytest.raises(PlanDiverged):
        recorder.model(fail)()
    error = recorder.trace.events[0].error
    assert error is not None
    assert error["type"] == "agentlease.errors.PlanDiverged"


def test_values_that_are_not_json_are_recorded_by_repr_and_the_call_still_returns() -> None:
    recorder = Recorder()

    class Reply:
        def __repr__(self) -> str:
            return "Reply(ok)"

    reply = Reply()

    def model(messages: object, stop: object = None) -> object:
        return reply

    result = recorder.model(model)(({1, 2},), stop=float("nan"))
    assert result is reply
    (event,) = recorder.trace.events
    assert event.request == {"args": [["{1, 2}"]], "kwargs": {"stop": "nan"}}
    assert event.response == "Reply(ok)"
    assert recorder.trace.dumps()  # the whole trace encodes
    assert request_of(({1, 2},), stop=float("nan")) == event.request


def test_arguments_are_recorded_as_they_were_at_the_call() -> None:
    recorder = Recorder()
    messages = ["hi"]
    recorder.model(len)(messages)
    messages.append("later")
    assert recorder.trace.events[0].request == {"args": [["hi"]], "kwargs": {}}


async def test_concurrent_tasks_keep_their_scopes_and_events_keep_call_order() -> None:
    recorder = Recorder()
    release = asyncio.Event()

    async def slow(prompt: str) -> str:
        await release.wait()
        return prompt

    async def fast(prompt: str) -> str:
        return prompt

    aslow, afast = recorder.model(slow), recorder.model(fast)

    async def first() -> None:
        with recorder.task("x"):
            await aslow("x1")  # began first, ends last

    async def second() -> None:
        with recorder.task("y"):
            await afast("y1")
            await afast("y2")
        release.set()

    await asyncio.gather(first(), second())
    assert [(e.task, e.step, e.response) for e in recorder.trace.events] == [
        ("x", "m1", "x1"),
        ("y", "m1", "y1"),
        ("y", "m2", "y2"),
    ]


def test_the_wrapper_keeps_the_functions_name_and_kind() -> None:
    recorder = Recorder()
    assert recorder.model(llm).__name__ == "llm"
    assert asyncio.iscoroutinefunction(recorder.model(allm))
    assert not asyncio.iscoroutinefunction(recorder.tool(lookup))


def replay_trace() -> Trace:
    recorder = Recorder()
    model = recorder.model(llm)
    with recorder.task("a"):
        model("a1")
        model("a2")
    with recorder.task("b"):
        model("b1")
    with recorder.task("a"):
        model("a3")
    return recorder.trace


def test_replay_returns_each_tasks_responses_in_order_and_tasks_are_independent() -> None:
    replay = ReplayModel(replay_trace())
    assert replay.remaining() == {"a": 3, "b": 1}
    assert replay("a") == {"text": "plan for a1", "temperature": 0.0}
    assert replay("b") == {"text": "plan for b1", "temperature": 0.0}
    assert replay("a")["text"] == "plan for a2"
    assert replay.remaining() == {"a": 1, "b": 0}
    assert replay("a")["text"] == "plan for a3"
    assert replay.remaining() == {"a": 0, "b": 0}


async def test_replay_async_face() -> None:
    replay = ReplayModel(replay_trace())
    texts = [await replay.acall("a") for _ in range(3)]
    assert [t["text"] for t in texts] == ["plan for a1", "plan for a2", "plan for a3"]
    with pytest.raises(PlanDiverged, match="step m4 of task 'a'"):
        await replay.acall("a")


def test_replay_by_step() -> None:
    replay = ReplayModel(replay_trace())
    assert replay("a", "m2")["text"] == "plan for a2"
    assert replay("a")["text"] == "plan for a1"
    assert replay("a")["text"] == "plan for a3"  # m2 was served already
    assert replay.remaining() == {"a": 0, "b": 1}


def test_replay_at_a_step_serves_it_to_every_attempt() -> None:
    replay = ReplayModel(replay_trace())
    for _attempt in range(3):  # each attempt replays the plan from its first step
        assert replay.at("a", "m1")["text"] == "plan for a1"
        assert replay.at("a", "m3")["text"] == "plan for a3"
    assert replay.remaining() == {"a": 3, "b": 1}  # at() serves without using anything up
    with pytest.raises(PlanDiverged, match="step m4 of task 'a'") as info:
        replay.at("a", "m4")
    assert (info.value.task, info.value.held) == ("a", 3)
    with pytest.raises(PlanDiverged, match="task 'zz'"):
        replay.at("zz", "m1")


def test_replay_returns_a_copy_each_caller_may_change() -> None:
    replay = ReplayModel(replay_trace())
    first = replay("b")
    assert isinstance(first, dict)
    first["text"] = "changed"
    replay.reset()
    assert replay("b") == {"text": "plan for b1", "temperature": 0.0}


def test_one_call_too_many_diverges() -> None:
    replay = ReplayModel(replay_trace())
    replay("b")
    with pytest.raises(PlanDiverged) as info:
        replay("b")
    err = info.value
    assert (err.task, err.step, err.held) == ("b", "m2", 1)
    assert str(err).startswith(
        "the plan diverged at step m2 of task 'b': the trace holds 1 model responses for it"
    )


def test_an_unknown_task_or_step_diverges() -> None:
    replay = ReplayModel(replay_trace())
    with pytest.raises(PlanDiverged, match="step m1 of task 'z': the trace holds 0") as info:
        replay("z")
    assert (info.value.task, info.value.step, info.value.held) == ("z", "m1", 0)
    with pytest.raises(PlanDiverged, match="no response was recorded under step 'plan'") as info:
        replay("a", "plan")
    assert (info.value.task, info.value.step, info.value.held) == ("a", "plan", 3)
    replay("a", "m1")
    with pytest.raises(PlanDiverged, match="recorded under step 'm1' were all served"):
        replay("a", "m1")
    assert replay.remaining() == {"a": 2, "b": 1}  # a refusal serves nothing


def test_strict_replay_refuses_another_request() -> None:
    replay = ReplayModel(replay_trace(), strict_requests=True)
    assert replay("a", request=request_of("a1"))["text"] == "plan for a1"
    with pytest.raises(PlanDiverged) as info:
        replay("a", request=request_of("something else"))
    err = info.value
    assert (err.task, err.step) == ("a", "m2")
    assert 'asked {"args":["something else"],"kwargs":{}}' in str(err)
    assert 'recorded {"args":["a2"],"kwargs":{}}' in str(err)
    assert replay("a", request={"kwargs": {}, "args": ["a2"]})["text"] == "plan for a2"


def test_a_lax_replay_ignores_the_request() -> None:
    replay = ReplayModel(replay_trace())
    assert replay("b", request="anything")["text"] == "plan for b1"


def test_a_recorded_model_error_is_raised_again() -> None:
    recorder = Recorder()

    def overloaded(prompt: str) -> str:
        raise TimeoutError("model overloaded")

    with recorder.task("a"), pytest.raises(TimeoutError):
        recorder.model(overloaded)("hi")
    replay = ReplayModel(recorder.trace)
    with pytest.raises(RecordedError, match="TimeoutError: model overloaded") as info:
        replay("a")
    assert (info.value.task, info.value.step, info.value.error_type) == ("a", "m1", "TimeoutError")
    assert info.value.error_message == "model overloaded"
    assert replay.remaining() == {"a": 0}


def test_reset_starts_over() -> None:
    replay = ReplayModel(replay_trace())
    first = [replay("a") for _ in range(3)]
    with pytest.raises(PlanDiverged):
        replay("a")
    replay.reset()
    assert replay.remaining() == {"a": 3, "b": 1}
    assert [replay("a") for _ in range(3)] == first


def test_replay_serves_each_response_once_across_threads() -> None:
    recorder = Recorder()
    model = recorder.model(llm)
    with recorder.task("a"):
        for i in range(200):
            model(str(i))
    replay = ReplayModel(recorder.trace)
    got: list[object] = []

    def worker() -> None:
        for _ in range(50):
            got.append(replay("a"))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(g["text"] for g in got) == sorted(f"plan for {i}" for i in range(200))
    assert replay.remaining() == {"a": 0}


def event_line(**change: object) -> bytes:
    row: dict[str, object] = {
        "kind": "model",
        "task": "a",
        "step": "m1",
        "name": "llm",
        "request": None,
        "response": "ok",
        "error": None,
        "started": 0.0,
        "elapsed": 0.5,
    }
    return orjson.dumps({**row, **change})


HEADER = b'{"format":"agentlease-trace","version":1}'


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "an empty trace file"),
        (b"\n  \n", "an empty trace file"),
        (b'{"format":"agentlease-history","version":1}\n', "not an agentlease trace"),
        (b"[1, 2]\n", "not an agentlease trace"),
        (b'{"format":"agentlease-trace","version":2}\n', "trace version 2; this library reads"),
        (b'{"format":"agentlease-trace"}\n', "trace version None"),
        (HEADER + b"\n{not json\n", "a trace line is not JSON"),
        (HEADER + b"\n[1]\n", "trace line 2 is not an event"),
        (HEADER + b"\n" + event_line(kind="prompt"), "trace line 2 is not an event"),
        (HEADER + b"\n" + event_line(step=3), "trace line 2 is not an event"),
        (HEADER + b"\n" + event_line(started="soon"), "trace line 2 is not an event"),
        (HEADER + b"\n" + event_line(error={"type": "X"}), "trace line 2 is not an event"),
        (HEADER + b"\n" + event_line() + b"\n" + event_line(error="x"), "trace line 3"),
    ],
)
def test_a_bad_file_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Trace.loads(data)


def test_a_file_written_elsewhere_loads() -> None:
    data = HEADER + b"\n" + event_line(error={"type": "E", "message": "m"}, response=None)
    (event,) = Trace.loads(data).events
    assert event == TraceEvent(
        "model", "a", "m1", "llm", None, None, {"type": "E", "message": "m"}, 0.0, 0.5
    )
    assert (TRACE_FORMAT, TRACE_VERSION) == ("agentlease-trace", 1)


def test_openai_and_anthropic_responses_reduce_to_one_shape() -> None:
    openai = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": "refund", "arguments": '{"id": 1}'},
                        },
                        {"type": "function", "function": {"name": "raw", "arguments": "not json"}},
                    ],
                }
            }
        ]
    }
    assert from_openai_chat(openai) == {
        "text": "",
        "tool_calls": [
            {"name": "refund", "arguments": {"id": 1}},
            {"name": "raw", "arguments": "not json"},
        ],
    }
    assert from_openai_chat({"choices": [{"message": {"content": "hi"}}]}) == {
        "text": "hi",
        "tool_calls": [],
    }
    anthropic = {
        "content": [
            {"type": "text", "text": "Refunding "},
            {"type": "tool_use", "id": "t", "name": "refund", "input": {"id": 1}},
            {"type": "text", "text": "now."},
        ]
    }
    assert from_anthropic_message(anthropic) == {
        "text": "Refunding now.",
        "tool_calls": [{"name": "refund", "arguments": {"id": 1}}],
    }
    with pytest.raises(InvalidInput, match="OpenAI"):
        from_openai_chat({"choices": []})
    with pytest.raises(InvalidInput, match="Anthropic"):
        from_anthropic_message({"content": "text"})
