"""What the framework lanes share (:mod:`.base`, :mod:`.identity`, :mod:`.code`,
:mod:`.failures`) and the dispatcher that picks a lane (:mod:`.lanes`).

The lanes (``evalsnap.adk``, ``evalsnap.langgraph``) import from here and never from each
other; this package names them only in :data:`.lanes.LANES`, imported on first use.
"""
