"""Running the agent on one eval case through ADK's own machinery."""

from __future__ import annotations

import asyncio
from typing import Any

from google.adk.apps.app import App
from google.adk.evaluation.eval_case import EvalCase, Invocation
from google.adk.evaluation.evaluation_generator import EvaluationGenerator
from google.adk.evaluation.simulation.user_simulator_provider import UserSimulatorProvider
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.sessions.in_memory_session_service import InMemorySessionService

from evalsnap import settings
from evalsnap.adk._user_code import off_loop_sync_tools
from evalsnap.agents.base import LoadedAgent, clean_state
from evalsnap.deadlines import DeadlineExceeded, exceeded, within_inference_deadline
from evalsnap.records.inference import ModelUsage


class _CountingPlugin(BasePlugin):
    """Counts requests at the model boundary, whatever model the agent uses, keeps the usage
    each response reports, and keeps each model call's deadline
    (``EVALSNAP_AGENT_CALL_TIMEOUT``).

    ADK hands an App's plugins to the runs of its AgentTools (``include_plugins``), so
    their inner model calls are counted here too, tokens with calls.

    A call is open from ``before_model_callback`` until its first response, its error, or
    an event of its agent (an agent callback that answered instead of the model). A call
    still open at its deadline cancels the inference
    (:func:`evalsnap.deadlines.within_inference_deadline`), which then fails.
    """

    def __init__(self, call_timeout: float | None = None) -> None:
        super().__init__(name="evalsnap_model_call_counter")
        self.calls = 0
        self.usage: list[ModelUsage] = []
        self.call_timeout = call_timeout or settings.get().agent_call_timeout
        self.expired: DeadlineExceeded | None = None
        self.task: asyncio.Task[Any] | None = None
        self._open: dict[int, tuple[str, asyncio.TimerHandle]] = {}

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> None:
        self.calls += 1
        agent = str(getattr(callback_context, "agent_name", ""))
        what = f"agent model call ({llm_request.model or 'model'} for {agent or 'the agent'})"
        key = id(callback_context.actions)  # the same object in this call's after/error callbacks
        handle = asyncio.get_running_loop().call_later(self.call_timeout, self._expire, key, what)
        self._close(key)
        self._open[key] = (agent, handle)
        return None

    async def after_model_callback(self, *, callback_context: Any, llm_response: Any) -> None:
        self._close(id(callback_context.actions))
        usage = getattr(llm_response, "usage_metadata", None)
        if usage is not None and not getattr(llm_response, "partial", False):
            self.usage.append(ModelUsage(model=getattr(llm_response, "model_version", None),
                                         usage=usage.model_dump(mode="json", exclude_none=True)))
        return None

    async def on_model_error_callback(self, *, callback_context: Any, llm_request: Any,
                                      error: Exception) -> None:
        self._close(id(callback_context.actions))
        return None

    async def on_event_callback(self, *, invocation_context: Any, event: Any) -> None:
        for key, (agent, _) in list(self._open.items()):
            if agent == getattr(event, "author", None):
                self._close(key)
        return None

    def _close(self, key: int) -> None:
        entry = self._open.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    def _expire(self, key: int, what: str) -> None:
        self._open.pop(key, None)
        if self.expired is None:
            self.expired = exceeded(what, self.call_timeout, "EVALSNAP_AGENT_CALL_TIMEOUT")
        if self.task is not None:
            self.task.cancel()

    def arm(self, task: asyncio.Task[Any]) -> None:
        self.task = task

    def disarm(self) -> None:
        for key in list(self._open):
            self._close(key)


class CapturingSessionService(InMemorySessionService):
    """Records the state of the eval session when ADK first obtains it.

    For a pinned existing session that is its stored state, not ``SessionInput.state``.
    Capture is armed by :meth:`begin` (:class:`AdkCaseRun` calls it), so sessions a caller
    prepares beforehand (``create_session`` with stored state) are not mistaken for the
    eval session.
    """

    def __init__(self) -> None:
        super().__init__()
        self.initial_state: dict[str, Any] | None = None
        self.key: tuple[str, str, str] | None = None
        self._armed = False

    def begin(self) -> None:
        """Forgets any earlier capture; the next session ADK creates or gets is captured."""
        self.initial_state, self.key, self._armed = None, None, True

    def _capture(self, session: Any) -> Any:
        if session is not None and self._armed and self.key is None:
            self.key = (session.app_name, session.user_id, session.id)
            self.initial_state = clean_state(session.state)
        return session

    async def create_session(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._capture(await super().create_session(**kwargs))

    async def get_session(self, **kwargs: Any) -> Any:  # type: ignore[override]
        session = await super().get_session(**kwargs)
        return self._capture(session) if self.key is None else session


class RefusedCase(ValueError):
    """A case ADK refuses to run (its message, and what to change in the eval set)."""

    retryable = False


def _refusal(agent: LoadedAgent, case: EvalCase) -> RefusedCase | None:
    """ADK's own refusal of a case's set-up, if it refuses it: an empty
    ``session_input.app_name`` (ADK 2.13's ``Runner``: "app_name is required…")."""
    if case.session_input is None or case.session_input.app_name:
        return None
    from google.adk.runners import Runner

    try:
        Runner(app_name=case.session_input.app_name, agent=agent.root_agent,
               session_service=InMemorySessionService())
    except ValueError as exc:
        return RefusedCase(f"{exc} (ADK; eval case {case.eval_id!r} has an empty "
                           f"session_input.appName: set it to {agent.name!r}, the agent "
                           "package's name, as `adk eval` runs it)")
    return None


class AdkCaseRun:
    """One run of an ADK agent over one case, through ADK's ``EvaluationGenerator`` with a
    counting plugin added to the App (:class:`~evalsnap.agents.base.CaseRun`).

    ``user_simulator_config``: ADK's, for a ``conversation_scenario`` case;
    ``session_service``: the service whose captured session states are the record's.
    """

    def __init__(self, agent: LoadedAgent, case: EvalCase, *, user_simulator_config: Any = None,
                 session_service: CapturingSessionService | None = None) -> None:
        self.agent, self.case, self.user_simulator_config = agent, case, user_simulator_config
        self.counter = _CountingPlugin()
        self.sessions = session_service or CapturingSessionService()
        self.sessions.begin()
        base_app = agent.app or App(name=agent.name, root_agent=agent.root_agent)
        self.app = base_app.model_copy(update={"plugins": [*base_app.plugins, self.counter]})

    @property
    def model_calls(self) -> int:
        return self.counter.calls

    @property
    def model_usage(self) -> list[ModelUsage] | None:
        return self.counter.usage

    @property
    def initial_state(self) -> dict[str, Any] | None:
        return self.sessions.initial_state

    async def run(self) -> list[Invocation]:
        agent, case = self.agent, self.case
        refused = _refusal(agent, case)
        if refused is not None:
            raise refused
        with off_loop_sync_tools():  # a blocking tool cannot hold the loop past the deadline
            invocations: list[Invocation] = await within_inference_deadline(
                EvaluationGenerator._generate_inferences_from_root_agent(  # noqa: SLF001
                    root_agent=agent.root_agent,
                    user_simulator=UserSimulatorProvider(self.user_simulator_config).provide(case),
                    initial_session=case.session_input,
                    session_id=None,
                    session_service=self.sessions,
                    app=self.app,
                ), self.counter, f"the inference of case {case.eval_id!r}")
        return invocations

    async def final_state(self) -> dict[str, Any] | None:
        if self.sessions.key is None:
            return None
        app_name, user_id, session_id = self.sessions.key
        session = await InMemorySessionService.get_session(
            self.sessions, app_name=app_name, user_id=user_id, session_id=session_id)
        return clean_state(session.state) if session is not None else None
