"""agentlease.langgraph on real graphs and real stores: a node that sends an email and then
interrupts sends it once across the resume; a crash between the node's side effect and
LangGraph's checkpoint (a checkpointer that dies, a process SIGKILLed) sends it once; a later
step through the same node sends again; the reducers merge what parallel branches write in one
superstep, and refuse a disagreement."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

import agentlease as al
from agentlease.errors import MissingDriver, MissingIdentity, ReconciliationConflict
from tests.conftest import require

require("langgraph", "langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, Send, interrupt  # noqa: E402

from agentlease import langgraph as alg  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Mail(TypedDict, total=False):
    to: str
    rounds: int
    receipts: Annotated[list[str], operator.add]
    answers: Annotated[list[str], operator.add]


def mail_graph(keys: al.Idempotency, sent: list[str], *, loops: int = 1) -> Any:
    """A node that sends an email, then asks for approval; ``loops`` passes through it."""

    @alg.idempotent(tool="send_email", store=keys)
    def send_email(to: str) -> str:
        sent.append(to)
        return f"receipt-{len(sent)}"

    def notify(state: Mail) -> dict[str, Any]:
        receipt = send_email(state["to"])
        answer = interrupt(f"sent {receipt}: approve?")
        return {"receipts": [receipt], "answers": [answer], "rounds": state.get("rounds", 0) + 1}

    def again(state: Mail) -> str:
        return "notify" if state["rounds"] < loops else END

    graph = StateGraph(Mail)
    graph.add_node("notify", notify)
    graph.add_edge(START, "notify")
    graph.add_conditional_edges("notify", again)
    return graph.compile(checkpointer=InMemorySaver())


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else f"served_url_{request.param}"
    url: str = request.getfixturevalue(name)
    return url


def test_a_resume_after_interrupt_reruns_the_node_and_sends_once(store_url: str) -> None:
    sent: list[str] = []
    with al.Idempotency.connect(store_url) as keys:
        app = mail_graph(keys, sent)
        config = {"configurable": {"thread_id": "signup-ada"}}
        first = app.invoke({"to": "ada@example.com"}, config)
        assert first["__interrupt__"][0].value == "sent receipt-1: approve?"
        assert sent == ["ada@example.com"]
        done = app.invoke(Command(resume="yes"), config)
    # The node ran again from its start (the interrupt's prompt was rebuilt from the receipt
    # the replay returned), and the email went out once.
    assert sent == ["ada@example.com"]
    assert done["receipts"] == ["receipt-1"]
    assert done["answers"] == ["yes"]


def test_another_thread_is_another_action(sqlite_url: str) -> None:
    sent: list[str] = []
    with al.Idempotency.connect(sqlite_url) as keys:
        app = mail_graph(keys, sent)
        for thread in ("t-1", "t-2"):
            app.invoke({"to": "ada@example.com"}, {"configurable": {"thread_id": thread}})
    assert sent == ["ada@example.com", "ada@example.com"]


def test_a_later_step_through_the_same_node_sends_again(sqlite_url: str) -> None:
    sent: list[str] = []
    with al.Idempotency.connect(sqlite_url) as keys:
        app = mail_graph(keys, sent, loops=2)
        config = {"configurable": {"thread_id": "loop"}}
        app.invoke({"to": "ada@example.com"}, config)
        app.invoke(Command(resume="first"), config)  # step 2: notify again, a new action
        done = app.invoke(Command(resume="second"), config)
    assert sent == ["ada@example.com", "ada@example.com"]
    assert done["receipts"] == ["receipt-1", "receipt-2"]
    assert done["answers"] == ["first", "second"]


async def test_an_async_node_resumes_and_sends_once(sqlite_url: str) -> None:
    sent: list[str] = []
    async with al.AsyncIdempotency.connect(sqlite_url) as keys:

        @alg.idempotent(tool="send_email", store=keys)
        async def send_email(to: str) -> str:
            sent.append(to)
            return f"receipt-{len(sent)}"

        async def notify(state: Mail) -> dict[str, Any]:
            receipt = await send_email(state["to"])
            answer = interrupt("approve?")
            return {"receipts": [receipt], "answers": [answer]}

        graph = StateGraph(Mail)
        graph.add_node("notify", notify)
        graph.add_edge(START, "notify")
        graph.add_edge("notify", END)
        app = graph.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "async"}}
        await app.ainvoke({"to": "ada@example.com"}, config)
        done = await app.ainvoke(Command(resume="ok"), config)
    assert sent == ["ada@example.com"]
    assert done["receipts"] == ["receipt-1"]


class CheckpointerDown(Exception):
    pass


class DyingSaver(InMemorySaver):
    """A checkpointer that is down from the moment ``down`` is set until it is cleared: what a
    process that died right after the node's side effect leaves behind."""

    down = False

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise CheckpointerDown("the checkpointer is gone")
        return super().put(*args, **kwargs)

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        if self.down:
            raise CheckpointerDown("the checkpointer is gone")
        super().put_writes(*args, **kwargs)


def test_a_crash_between_the_side_effect_and_the_checkpoint_sends_once(sqlite_url: str) -> None:
    sent: list[str] = []
    runs: list[str] = []
    saver = DyingSaver()
    with al.Idempotency.connect(sqlite_url) as keys:

        @alg.idempotent(tool="send_email", store=keys)
        def send_email(to: str) -> str:
            sent.append(to)
            return f"receipt-{len(sent)}"

        def notify(state: Mail) -> dict[str, Any]:
            runs.append("notify")
            receipt = send_email(state["to"])
            if len(runs) == 1:  # the first run dies: nothing it writes after this is recorded
                saver.down = True
            return {"receipts": [receipt]}

        graph = StateGraph(Mail)
        graph.add_node("notify", notify)
        graph.add_edge(START, "notify")
        graph.add_edge("notify", END)
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "crash"}}
        with pytest.raises(CheckpointerDown):
            app.invoke({"to": "ada@example.com"}, config)
        assert app.get_state(config).next == ("notify",)  # the step was never recorded
        saver.down = False
        done = app.invoke(None, config)
    assert runs == ["notify", "notify"]  # LangGraph ran the node again...
    assert sent == ["ada@example.com"]  # ...and the email went out once
    assert done["receipts"] == ["receipt-1"]


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from typing import Annotated, TypedDict
    import operator

    import agentlease as al
    from agentlease import langgraph as alg
    from langgraph.graph import END, START, StateGraph
    from tests.integrations._file_saver import FileSaver

    url, where, kill = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "kill"

    class Mail(TypedDict, total=False):
        to: str
        receipts: Annotated[list[str], operator.add]

    keys = al.Idempotency.connect(url)

    @alg.idempotent(tool="send_email", store=keys)
    def send_email(to: str) -> str:
        with open(where / "outbox", "a") as out:
            out.write(to + " " + str(os.getpid()) + "\\n")
        return "receipt-" + str(os.getpid())

    def notify(state):
        with open(where / "runs", "a") as out:
            out.write("notify\\n")
        receipt = send_email(state["to"])
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)  # after the side effect, before the checkpoint
        return {"receipts": [receipt]}

    graph = StateGraph(Mail)
    graph.add_node("notify", notify)
    graph.add_edge(START, "notify")
    graph.add_edge("notify", END)
    app = graph.compile(checkpointer=FileSaver(where / "checkpoints"))
    config = {"configurable": {"thread_id": "killed"}}
    state = app.get_state(config)
    done = app.invoke(None if state.next else {"to": "ada@example.com"}, config)
    print(done["receipts"][0])
    keys.close()
    """
)


def test_a_process_killed_after_the_side_effect_sends_once_when_rerun(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}

    def child(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CHILD, sqlite_url, str(tmp_path), mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    killed = child("kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    sent = (tmp_path / "outbox").read_text().splitlines()
    assert [line.split()[0] for line in sent] == ["ada@example.com"]
    rerun = child("run")
    assert rerun.returncode == 0, rerun.stderr
    assert (tmp_path / "runs").read_text() == "notify\nnotify\n"  # the node ran again
    assert (tmp_path / "outbox").read_text().splitlines() == sent  # the email did not
    # ...and it returned the receipt that the killed process's send recorded.
    assert rerun.stdout.strip() == "receipt-" + sent[0].split()[1]


def test_an_idempotent_node_returns_its_first_update_after_a_crash(sqlite_url: str) -> None:
    charges: list[int] = []
    saver = DyingSaver()
    with al.Idempotency.connect(sqlite_url) as keys:

        def charge(state: Mail) -> dict[str, Any]:
            charges.append(1)
            saver.down = True
            return {"receipts": [f"charge-{len(charges)}"]}

        graph = StateGraph(Mail)
        graph.add_node("charge", alg.idempotent_node(charge, store=keys))
        graph.add_edge(START, "charge")
        graph.add_edge("charge", END)
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "node"}}
        with pytest.raises(CheckpointerDown):
            app.invoke({"to": "ada@example.com"}, config)
        saver.down = False
        done = app.invoke(None, config)
    assert charges == [1]
    assert done["receipts"] == ["charge-1"]


def test_an_idempotent_node_that_interrupts_first_acts_once_on_the_resume(
    sqlite_url: str,
) -> None:
    charges: list[str] = []
    with al.Idempotency.connect(sqlite_url) as keys:

        def charge(state: Mail, config: RunnableConfig) -> dict[str, Any]:
            answer = interrupt("charge?")  # the interrupt releases the key: nothing was done
            charges.append(f"{answer}:{config['configurable']['thread_id']}")
            return {"answers": [answer]}

        graph = StateGraph(Mail)
        graph.add_node("charge", alg.idempotent_node(charge, store=keys))
        graph.add_edge(START, "charge")
        graph.add_edge("charge", END)
        app = graph.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "approve"}}
        app.invoke({"to": "ada@example.com"}, config)
        assert charges == []
        done = app.invoke(Command(resume="yes"), config)
        assert app.get_state(config).next == ()
    assert charges == ["yes:approve"]  # the config was injected through the wrapper
    assert done["answers"] == ["yes"]


async def test_an_async_idempotent_node_runs_once_per_step(sqlite_url: str) -> None:
    runs: list[int] = []
    saver = DyingSaver()
    async with al.AsyncIdempotency.connect(sqlite_url) as keys:

        async def charge(state: Mail) -> dict[str, Any]:
            runs.append(1)
            saver.down = True
            return {"receipts": ["charged"]}

        graph = StateGraph(Mail)
        graph.add_node("charge", alg.idempotent_node(charge, store=keys))
        graph.add_edge(START, "charge")
        graph.add_edge("charge", END)
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "async-node"}}
        with pytest.raises(CheckpointerDown):
            await app.ainvoke({"to": "ada@example.com"}, config)
        saver.down = False
        done = await app.ainvoke(None, config)
    assert runs == [1]
    assert done["receipts"] == ["charged"]


def test_without_a_thread_the_action_is_refused(sqlite_url: str) -> None:
    sent: list[str] = []
    with al.Idempotency.connect(sqlite_url) as keys:

        @alg.idempotent(tool="send_email", store=keys)
        def send_email(to: str) -> str:
            sent.append(to)
            return "receipt"

        def notify(state: Mail) -> dict[str, Any]:
            return {"receipts": [send_email(state["to"])]}

        graph = StateGraph(Mail)
        graph.add_node("notify", notify)
        graph.add_edge(START, "notify")
        app = graph.compile()  # no checkpointer: no thread to key on
        with pytest.raises(MissingIdentity, match="thread_id"):
            app.invoke({"to": "ada@example.com"})
        with pytest.raises(MissingIdentity, match="outside"):
            send_email("ada@example.com")
    assert sent == []


def test_a_mismatched_store_is_refused(sqlite_url: str) -> None:
    with al.Idempotency.connect(sqlite_url) as keys:

        async def notify(state: Mail) -> dict[str, Any]:
            return {}

        with pytest.raises(al.InvalidInput, match="AsyncIdempotency"):
            alg.idempotent_node(notify, store=keys)  # type: ignore[call-overload]
        with pytest.raises(al.InvalidInput, match="AsyncIdempotency"):
            alg.idempotent(tool="notify", store=keys)(notify)


# -- reducers --------------------------------------------------------------------------------------


class Findings(TypedDict, total=False):
    branches: list[dict[str, Any]]
    tags: Annotated[list[str], alg.UnionReducer]
    price: Annotated[dict[str, Any], alg.MaxByVersionReducer]
    status: Annotated[str, alg.MustAgreeReducer]


def fan_out_graph() -> Any:
    """A ``Send`` fan-out: one ``branch`` task per finding, all in one superstep."""

    def plan(state: Findings) -> list[Send]:
        return [Send("branch", found) for found in state["branches"]]

    def branch(found: dict[str, Any]) -> dict[str, Any]:
        return dict(found["writes"])

    graph = StateGraph(Findings)
    graph.add_node("branch", branch)
    graph.add_conditional_edges(START, plan, ["branch"])
    graph.add_edge("branch", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_parallel_branches_are_reconciled() -> None:
    app = fan_out_graph()
    branches = [
        {"writes": {"tags": ["b", "a"], "price": {"value": 10, "version": 1}, "status": "paid"}},
        {
            "writes": {
                "tags": ["a", "c", "b"],
                "price": {"value": 12, "version": 3, "source": "billing"},
                "status": al.Fact(field="status", value="paid", source="ledger"),
            }
        },
        {"writes": {"tags": ["c", "d"], "price": {"value": 11, "version": 2}}},
    ]
    config = {"configurable": {"thread_id": "fan-out"}}
    done = app.invoke({"branches": branches}, config)
    assert done["tags"] == ["b", "a", "c", "d"]  # each once, in order of first appearance
    assert done["price"] == {"value": 12, "version": 3, "source": "billing"}
    assert done["status"] == "paid"
    # The merged values are what the checkpoint keeps: a later write of an older version loses.
    again = app.invoke(
        {"branches": [{"writes": {"price": {"value": 9, "version": 2}, "tags": ["e"]}}]}, config
    )
    assert again["price"]["value"] == 12
    assert again["tags"] == ["b", "a", "c", "d", "e"]


def test_parallel_branches_that_disagree_raise_naming_the_field() -> None:
    app = fan_out_graph()
    branches = [
        {"writes": {"status": al.Fact(field="status", value="paid", source="ledger")}},
        {"writes": {"status": al.Fact(field="status", value="refunded", source="crm")}},
    ]
    with pytest.raises(ReconciliationConflict) as caught:
        app.invoke({"branches": branches}, {"configurable": {"thread_id": "disagree"}})
    assert caught.value.field == "status"
    assert {caught.value.first.source, caught.value.second.source} == {"ledger", "crm"}
    assert "'status'" in str(caught.value)


def test_two_values_at_the_top_version_conflict() -> None:
    app = fan_out_graph()
    branches = [
        {"writes": {"price": {"value": 10, "version": 4}}},
        {"writes": {"price": {"value": 11, "version": 4}}},
    ]
    with pytest.raises(ReconciliationConflict) as caught:
        app.invoke({"branches": branches}, {"configurable": {"thread_id": "versions"}})
    assert caught.value.field == "price"


def test_parallel_edges_that_disagree_conflict_but_a_later_step_may_change_the_value() -> None:
    def left(state: Findings) -> dict[str, Any]:
        return {"status": "open"}

    def right(state: Findings) -> dict[str, Any]:
        return {"status": state.get("tags", ["open"])[0]}

    def close(state: Findings) -> dict[str, Any]:
        return {"status": "closed"}

    graph = StateGraph(Findings)
    for name, fn in (("left", left), ("right", right), ("close", close)):
        graph.add_node(name, fn)
    graph.add_edge(START, "left")
    graph.add_edge(START, "right")
    graph.add_edge(["left", "right"], "close")
    graph.add_edge("close", END)
    app = graph.compile()
    assert app.invoke({"tags": ["open"]})["status"] == "closed"
    with pytest.raises(ReconciliationConflict, match="'status'"):
        app.invoke({"tags": ["pending"]})


def test_without_langgraph_the_import_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['langgraph'] = None\n"
        "from agentlease.errors import MissingDriver\n"
        "try:\n"
        "    import agentlease.langgraph\n"
        "except MissingDriver as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'agentlease[langgraph]'" in out.stdout
    assert issubclass(MissingDriver, al.AgentLeaseError)


def test_import_agentlease_does_not_import_langgraph() -> None:
    code = "import sys, agentlease; print('langgraph' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.stdout.strip() == "False", out.stderr
