"""Refuses a `POST /predict` body that is not JSON or a form before LitServe tries to parse it.

LitServe parses the body in the HTTP process and answers any parse error with a 500: a client
that sent malformed JSON, JSON nested too deeply, a broken form (no boundary, bad parts) or a
wrong content type should get a 4xx that says so. The body is parsed here once to find out.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
MAX_JSON_NESTING = 32


def nesting(value: Any) -> int:
    """How many arrays and objects deep `value` goes (iterative: the value may be too deep for recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


class CheckRequestBody:
    def __init__(self, app: ASGIApp, path: str = "/predict") -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        media_type, _, params = headers.get("content-type", "").partition(";")
        media_type = media_type.strip().lower()
        if media_type not in (*FORM_TYPES, "application/json"):
            expected = "application/json (a JSON object) or multipart/form-data (file uploads)"
            await self._refuse(scope, receive, send, 415, f"Content-Type {media_type or 'missing'}; send {expected}.")
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

        def replay() -> Receive:
            queue = list(messages)

            async def next_message() -> Message:
                return queue.pop(0) if queue else await receive()

            return next_message

        # LitServe tells a form from JSON by comparing the header's text: give it the media type as it expects it.
        content_type = f"{media_type}; {params.strip()}" if media_type == "multipart/form-data" else media_type
        scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"content-type"]}
        scope["headers"].append((b"content-type", content_type.encode("latin-1")))
        problem = await self._parse_error(media_type, scope, replay(), messages)
        if problem:
            await self._refuse(scope, receive, send, 400, problem)
            return
        await self.app(scope, replay(), send)

    @staticmethod
    async def _parse_error(media_type: str, scope: Scope, receive: Receive, messages: list[Message]) -> str | None:
        """Why the body cannot be parsed as `media_type`, or None."""
        if media_type == "application/json":
            try:
                too_deep = nesting(json.loads(b"".join(m.get("body", b"") for m in messages))) > MAX_JSON_NESTING
            except (ValueError, UnicodeDecodeError) as err:
                return f"the body is not valid JSON ({err})."
            except RecursionError:  # deeper than Python's recursion limit
                too_deep = True
            if too_deep:  # LitServe pickles the body to the worker, which fails past a few hundred levels
                return f"the body is JSON nested more than {MAX_JSON_NESTING} levels deep (a request has 2)."
            return None
        try:
            form = await Request(scope, receive).form()
        except (HTTPException, MultiPartException) as err:
            detail = err.detail if isinstance(err, HTTPException) else err.message
            return f"the body is not a valid {media_type} form ({detail.rstrip('.')})."
        await form.close()
        return None

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
        await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
