"""The offline demo's directory: not an installed package.

``examples/`` plays the role of an agent's parent directory (what ``adk web`` calls the
agents dir): ``shop_agent/`` is the demo agent package, and it carries its own offline agent
and judge models (``shop_agent.offline_models``, registered through the
``"evalsnapPlugins"`` entry of ``shop_agent/test_config.json``). Import them as
``shop_agent.…`` with this directory on ``sys.path``, never as ``examples.shop_agent.…``.
"""
