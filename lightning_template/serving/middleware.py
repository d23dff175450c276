"""Refuses a `POST /predict` body that is not JSON or a form before LitServe tries to parse it.

LitServe parses the body in the HTTP process and answers a parse error with a 500; a client
that sent malformed JSON or a wrong content type should get a 4xx that says so.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


class CheckRequestBody:
    def __init__(self, app: ASGIApp, path: str = "/predict") -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type in FORM_TYPES:
            await self.app(scope, receive, send)
            return
        if content_type != "application/json":
            expected = "application/json (a JSON object) or multipart/form-data (file uploads)"
            await self._refuse(scope, receive, send, 415, f"Content-Type {content_type or 'missing'}; send {expected}.")
            return
        messages: list[Message] = []
        while True:  # read here; LitServe's MaxSizeMiddleware (`--max_payload_mb`) raises past the limit
            try:
                message = await receive()
            except HTTPException as err:
                await self._refuse(scope, receive, send, err.status_code, f"{err.detail}.")
                return
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            json.loads(b"".join(m.get("body", b"") for m in messages))
        except (ValueError, UnicodeDecodeError) as err:
            await self._refuse(scope, receive, send, 400, f"the body is not valid JSON ({err}).")
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
        await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
