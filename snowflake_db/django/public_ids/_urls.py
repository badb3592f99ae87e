"""The URL path converter of public numbers (:func:`public_id_converter` says how it behaves).

Django treats a ``ValueError`` from ``to_python`` as no match
(https://docs.djangoproject.com/en/stable/topics/http/urls/#registering-custom-path-converters),
and ``PublicIdError`` is one.
"""

from __future__ import annotations

from ...errors import InvalidArgumentError

__all__ = ["public_id_converter"]

#: Crockford base32 symbols in either case, with hyphens for grouped numbers; the codec checks
#: the length and the check symbol.
PUBLIC_ID_REGEX = "[0-9A-Za-z][0-9A-Za-z-]*"


class PublicIdConverter:
    """Converts a public number of :attr:`namespace` to its key and back."""

    regex = PUBLIC_ID_REGEX
    namespace = ""

    def to_python(self, value: str) -> int:
        from ...public_ids import codec_for

        return codec_for(self.namespace).decode(value)

    def to_url(self, value: int | str) -> str:
        from ...public_ids import codec_for

        codec = codec_for(self.namespace)
        if isinstance(value, str):
            value = codec.decode(value)  # refuses a number of another namespace
        return codec.encode(value)


def public_id_converter(namespace: str) -> type[PublicIdConverter]:
    """A converter class for ``django.urls.register_converter`` decoding ``namespace``:
    ``path("orders/<order_number:pk>/", ...)``.

    ``register_converter(public_id_converter("orders"), "order_number")`` once (in ``urls.py``);
    the view then receives the decoded key as an ``int``, and a text that is not a number of the
    namespace (mistyped, another key or namespace) does not match, so Django answers 404.
    ``reverse()`` takes the key (or a public number) and puts the public number in the URL.
    """
    if not isinstance(namespace, str) or not namespace:
        raise InvalidArgumentError(
            f"a public number namespace must be a non-empty string, got {namespace!r}"
        )
    name = "PublicIdConverter_" + "".join(c if c.isalnum() else "_" for c in namespace)
    return type(name, (PublicIdConverter,), {"namespace": namespace})
