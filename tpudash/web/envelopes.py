"""What a browser page says to its dashboard, over either transport: textual-serve's message envelopes and the terminal size asked for.

The WebSocket (``tpudash.web.serve``) and the polling transport
(``tpudash.web.polling``) both hand each message here; only well-formed
envelopes reach the dashboard's service, the rest are dropped.
"""

from __future__ import annotations

import json
from typing import Any


async def dispatch(service: Any, envelope: Any) -> str | None:
    """One message from the page (textual-serve's envelopes); a reply to send back, if any."""
    if not isinstance(envelope, list) or not envelope:
        return None
    kind = envelope[0]
    if kind == "stdin" and len(envelope) > 1 and isinstance(envelope[1], str):
        await service.send_bytes(envelope[1].encode("utf-8"))
    elif kind == "resize" and len(envelope) > 1 and isinstance(envelope[1], dict):
        width, height = envelope[1].get("width"), envelope[1].get("height")
        if isinstance(width, int) and isinstance(height, int) and 1 <= width <= 1000 and 1 <= height <= 1000:
            await service.set_terminal_size(width, height)
    elif kind == "ping" and len(envelope) > 1:
        return json.dumps(["pong", envelope[1]])
    elif kind == "blur":
        await service.blur()
    elif kind == "focus":
        await service.focus()
    return None


def terminal_size(request: Any) -> tuple[int, int]:
    """The terminal's columns and rows a page asks for (``?width=&height=``); 80×24 for what is missing or absurd."""

    def number(name: str, default: int) -> int:
        try:
            value = int(request.query.get(name, default))
        except ValueError:
            return default
        return value if 1 <= value <= 1000 else default

    return number("width", 80), number("height", 24)
