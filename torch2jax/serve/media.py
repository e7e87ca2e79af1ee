"""Images in chat messages: an OpenAI `image_url` content part's URL read into a Pillow image.

A `data:` URI (base64, as OpenAI's clients send local images) is always read. A local path (`file://` URI or a plain
path) is read only when the server was started with a directory to read from (`--allowed-local-media-path`), and only
inside it: a client must not make the server open arbitrary files. The server does not fetch http(s) URLs (it may have
no network, and a fetch would hold a request slot on someone else's server); the refusal says to send the image inline.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import InputSpecError


def read_image(url: str, media_root: Path | None = None) -> Any:
    """The image an image_url part names, decoded (Pillow, loaded); InputSpecError saying what is wrong and what to send."""
    from PIL import Image, UnidentifiedImageError

    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64") or not payload:
            raise InputSpecError("an image data URI must be base64: data:image/png;base64,<the image's bytes in base64>")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InputSpecError("an image data URI's payload is not valid base64") from None
        source: Any = io.BytesIO(data)
    elif url.startswith(("http://", "https://")):
        raise InputSpecError("this server does not fetch image URLs: send the image inline as a data URI "
                             "(data:image/png;base64,...)")
    else:
        source = local_path(url, media_root)
    try:
        image = Image.open(source)
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        raise InputSpecError(f"the image could not be read ({type(err).__name__}: {err})") from None
    return image


def local_path(url: str, media_root: Path | None) -> Path:
    """A file:// URI or a plain path, allowed only inside `media_root`."""
    if media_root is None:
        raise InputSpecError("local image paths are refused unless the server was started with "
                             "--allowed-local-media-path DIR; send the image inline as a data URI instead")
    raw = unquote(urlparse(url).path) if url.startswith("file://") else url
    root = media_root.resolve()
    path = (root / raw).resolve() if not Path(raw).is_absolute() else Path(raw).resolve()
    if not path.is_relative_to(root):
        raise InputSpecError(f"the image path {raw!r} is outside the directory this server reads images from ({root})")
    if not path.is_file():
        raise InputSpecError(f"no image file at {raw!r} (inside {root})")
    return path
