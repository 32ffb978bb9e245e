"""``specvis serve``: an image-generation server (OpenAI's images API) over one engine per model.

``engine.Engine`` owns the model and decodes in one worker thread with continuous batching across
requests (``rows.LiveRows``); ``app.make_app`` is the FastAPI front, which only validates, queues and
awaits; ``ray`` deploys the same app on Ray Serve. Needs the ``serve`` extra (fastapi, uvicorn,
prometheus-client)."""
