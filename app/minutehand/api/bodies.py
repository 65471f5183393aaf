"""Request bodies as typed handler parameters (`data: JobIn`), decoded by
msgspec straight from the body's bytes and documented from the same type.

Litestar's default for a Struct `data` decodes the JSON to dicts and lists
first and converts those to the Struct leniently ("87" passes as 87), and
cannot keep a field as its JSON text (msgspec.Raw); its own schema of a
Struct leaves out msgspec's Meta (descriptions, patterns, the documented
limits). So every app and router that serves bodies names StrictBody as its
DTO: it decodes each handler's `data` type with one strict msgspec decoder
(schemas.decoder) and documents it with msgspec's JSON Schema of that type.

Failures follow Litestar's own path for bodies it cannot decode: the DTO
raises SerializationException from the msgspec error, Litestar answers it
with a ClientException, and problems.py decides on the cause: malformed JSON
(or an empty body) 400, a well-formed body of the wrong shape or types 422.

A body the handler decodes itself (in parts, off the event loop: a batch)
is a RawBody subclass: `data` is the bytes as sent, documented as its
`schema` Struct.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Generator
from typing import Any, ClassVar

import msgspec
from litestar.dto import AbstractDTO
from litestar.exceptions import SerializationException
from litestar.openapi.spec import Reference, Schema
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

from minutehand import protocol
from minutehand.protocol.api import decoder


_DECODE = "minutehand.decode_body"


class RawBody:
    """A body handed to its handler as sent; `schema` is what it holds."""
    schema: ClassVar[type[msgspec.Struct]]
    __slots__ = ("raw",)

    def __init__(self, raw: bytes):
        self.raw = raw


def _decode_for(kind: type) -> Callable[[bytes], Any]:
    if isinstance(kind, type) and issubclass(kind, RawBody):
        return kind
    return decoder(kind).decode


class StrictBody(AbstractDTO[Any]):
    """The DTO of every body: msgspec decodes, msgspec documents."""

    # handler_id -> decode. Each handler also keeps its own in its opt on
    # first use: handler_id is rebuilt on every access (~4 us a request).
    _decoders: ClassVar[dict[str, Callable[[bytes], Any]]] = {}

    @classmethod
    def create_for_field_definition(cls, field_definition: FieldDefinition, handler_id: str,
                                    backend_cls: Any = None) -> None:
        if field_definition.name == "data":
            cls._decoders[handler_id] = _decode_for(field_definition.annotation)

    @classmethod
    def is_supported_model_type_field(cls, field_definition: FieldDefinition) -> bool:
        return False                         # responses: Litestar's own encoding

    def decode_bytes(self, value: bytes) -> Any:
        handler = self.asgi_connection.route_handler
        decode = handler.opt.get(_DECODE)
        if decode is None:
            decode = handler.opt[_DECODE] = self._decoders[handler.handler_id]
        try:
            return decode(value)
        except (msgspec.DecodeError, RecursionError) as exc:     # ValidationError is a DecodeError
            raise SerializationException(str(exc)) from exc

    def decode_builtins(self, value: dict[str, Any]) -> Any:
        raise SerializationException("request body must be JSON")

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[Any, None, None]:
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False

    @classmethod
    def create_openapi_schema(cls, field_definition: FieldDefinition, handler_id: str,
                              schema_creator: Any) -> Reference | Schema:
        kind = field_definition.annotation
        if isinstance(kind, type) and issubclass(kind, RawBody):
            kind = kind.schema
        return openapi_schema(kind, schema_creator.schema_registry)


# ---------------------------------------------------------------- schema
def _structs(kind: Any) -> dict[str, type]:
    """The Struct types a body type is made of, by the names msgspec gives
    their schemas."""
    found: dict[str, type] = {}

    def walk(t: msgspec.inspect.Type) -> None:
        if isinstance(t, msgspec.inspect.StructType):
            if t.cls.__name__ in found:
                return
            found[t.cls.__name__] = t.cls
            for f in t.fields:
                walk(f.type)
        for attr in ("type", "item_type", "key_type", "value_type"):
            if isinstance(sub := getattr(t, attr, None), msgspec.inspect.Type):
                walk(sub)
        for sub in getattr(t, "types", ()) or getattr(t, "item_types", ()):
            walk(sub)

    walk(msgspec.inspect.type_info(kind))
    return found


_REF = "#/components/schemas/"
_SUBSCHEMAS = {"items", "additionalProperties", "not"}
_SUBSCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}


def openapi_schema(kind: Any, registry: Any) -> Reference | Schema:
    """msgspec's JSON Schema of `kind`, as Litestar schema objects: each
    Struct a component of the document (where Litestar keeps its own; the
    same component from a response is replaced by this, the decoder's),
    with what the Struct's `schema_extra` adds (what msgspec cannot say)."""
    structs = _structs(kind)
    (root,), components = msgspec.json.schema_components([kind], schema_hook=protocol.schema_hook,
                                                           ref_template=_REF + "{name}")
    components = msgspec.json.decode(msgspec.json.encode(components))    # defaults as plain JSON

    def ref(name: str) -> Reference:
        field = FieldDefinition.from_annotation(structs[name])
        reference = registry.get_reference_for_field_definition(field)
        if reference is None:
            registry.get_schema_for_field_definition(field)
            reference = registry.get_reference_for_field_definition(field)
        return reference

    def convert(node: dict[str, Any]) -> Reference | Schema:
        if "$ref" in node:
            return ref(node["$ref"].removeprefix(_REF))
        kwargs = {}
        for key, value in node.items():
            if key == "properties":
                value = {k: convert(v) for k, v in value.items()}
            elif key in _SUBSCHEMAS and isinstance(value, dict):
                value = convert(value)
            elif key in _SUBSCHEMA_LISTS:
                value = [convert(v) for v in value]
            kwargs["not_" if key == "not" else re.sub("([A-Z])", r"_\1", key).lower()] = value
        return Schema(**kwargs)

    for name, node in components.items():
        target = registry.from_reference(ref(name)).schema
        made = convert({**node, **getattr(structs[name], "schema_extra", {})})
        for field in Schema.__dataclass_fields__:
            setattr(target, field, getattr(made, field))
    return convert(msgspec.json.decode(msgspec.json.encode(root)))


class JobIdSchema(OpenAPISchemaPlugin):
    """Responses (documented by Litestar) name a JobId as the protocol does:
    a decimal string."""

    @staticmethod
    def is_plugin_supported_type(value: Any) -> bool:
        return value is protocol.JobId

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: Any) -> Schema:
        return Schema(**protocol.schema_hook(protocol.JobId))
