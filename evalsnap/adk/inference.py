"""Running the agent on one eval case through ADK's own machinery."""

from __future__ import annotations

import copy
import datetime as dt
import re
from typing import Any

from google.adk.apps.app import App
from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.evaluation_generator import EvaluationGenerator
from google.adk.evaluation.simulation.user_simulator_provider import UserSimulatorProvider
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.version import __version__ as ADK_VERSION

from evalsnap.adk.agent import LoadedAgent
from evalsnap.fingerprint import inference_fingerprint
from evalsnap.records import InferenceRecord

#: ADK writes bookkeeping such as ``__llm_request_key__`` into state.
_INTERNAL_KEY = re.compile(r"^__.*__$")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def clean_state(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """A detached copy without ADK's internal keys."""
    if state is None:
        return None
    return {k: copy.deepcopy(v) for k, v in state.items() if not _INTERNAL_KEY.match(k)}


class _CountingPlugin(BasePlugin):
    """Counts requests at the model boundary, whatever model the agent uses."""

    def __init__(self) -> None:
        super().__init__(name="evalsnap_model_call_counter")
        self.calls = 0

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> None:
        self.calls += 1
        return None


class CapturingSessionService(InMemorySessionService):
    """Records the state of the eval session when ADK first obtains it.

    For a pinned existing session that is its stored state, not ``SessionInput.state``.
    Capture is armed by :meth:`begin` (``run_inference`` calls it), so sessions a caller
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


async def run_inference(
    agent: LoadedAgent,
    case: EvalCase,
    *,
    eval_set_id: str,
    repetition: int = 0,
    run_id: str = "",
    attempt: int = 1,
    user_simulator_config: Any = None,
    session_service: CapturingSessionService | None = None,
) -> InferenceRecord:
    """Runs the agent over one case; an exception becomes a ``failure`` record."""
    counter = _CountingPlugin()
    sessions = session_service or CapturingSessionService()
    sessions.begin()
    base_app = agent.app or App(name=agent.name, root_agent=agent.root_agent)
    app = base_app.model_copy(update={"plugins": [*base_app.plugins, counter]})
    fields: dict[str, Any] = dict(
        inference_fingerprint=inference_fingerprint(agent.identity, case, repetition),
        eval_set_id=eval_set_id, eval_id=case.eval_id, repetition=repetition,
        app_name=case.session_input.app_name if case.session_input else agent.name,
        agent_name=agent.root_agent.name, adk_version=ADK_VERSION, attempts=attempt,
        run_id=run_id, created_at=now_iso(),
    )
    try:
        invocations = await EvaluationGenerator._generate_inferences_from_root_agent(  # noqa: SLF001
            root_agent=agent.root_agent,
            user_simulator=UserSimulatorProvider(user_simulator_config).provide(case),
            initial_session=case.session_input,
            session_id=None,
            session_service=sessions,
            app=app,
        )
    except Exception as exc:  # ADK's own service absorbs these too; we record them
        return InferenceRecord(status="failure", error=f"{type(exc).__name__}: {exc}",
                               model_calls=counter.calls,
                               initial_session_state=sessions.initial_state, **fields)
    final = None
    if sessions.key is not None:
        app_name, user_id, session_id = sessions.key
        session = await InMemorySessionService.get_session(
            sessions, app_name=app_name, user_id=user_id, session_id=session_id)
        final = clean_state(session.state) if session is not None else None
    return InferenceRecord(
        status="success", invocations=invocations, model_calls=counter.calls,
        initial_session_state=sessions.initial_state, final_session_state=final, **fields,
    )
