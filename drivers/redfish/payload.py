"""What a BMC answers, read defensively: JSON bodies, the links between resources, their paths, text clipped for
error messages (a hostile or broken BMC may put anything anywhere).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlparse

ROOT = "/redfish/v1"


def link(resource: Any, *keys: str) -> str:
    """The path a resource links under `keys` ({"Systems": {"@odata.id": PATH}}), or "" if it links none there
    (whatever else a BMC put in its place).
    """
    for key in keys:
        resource = resource.get(key) if isinstance(resource, dict) else None
    link = resource.get("@odata.id") if isinstance(resource, dict) else None
    return path_of(link) if isinstance(link, str) else ""


def json_of(resp: Any) -> Any:
    """The response's body as JSON, or None when it is empty or not JSON."""
    try:
        return json.loads(text_of(resp)) if text_of(resp).strip() else None
    except ValueError:
        return None


def text_of(resp: Any) -> str:
    """The response's body as text, or "" when it is not text."""
    try:
        return resp.text
    except Exception:  # a body that is not text
        return ""


def path_of(link: str) -> str:
    """A resource's path from its @odata.id (a path, or now and then a full URL)."""
    if not isinstance(link, str):
        return ""
    return urlparse(link).path if "://" in link else link


def clip(text: str, limit: int = 2000) -> str:
    """`text`, cut after `limit` characters (saying how many more there were)."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"
