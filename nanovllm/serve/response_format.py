"""Structured outputs over HTTP: OpenAI's `response_format` and vLLM's `structured_outputs`.

- `response_format: {"type": "json_object"}`: the output is a JSON object;
  `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`: a JSON value of that
  schema; `{"type": "text"}`: no constraint (OpenAI's default).
- `structured_outputs: {"json": ..., "regex": ..., "choice": [...], "grammar": ...,
  "json_object": true}`: vLLM's extension, the fields of `StructuredOutputsParams`.

Both become `SamplingParams.structured_outputs`. A constraint that does not compile, is longer
than the engine's bound or compiles for longer than its bound, is refused: a 400 naming the value
or the bound (`serving.py`), once the engine's compile thread has answered
(`structured_output/manager.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nanovllm.sampling_params import StructuredOutputsParams
from nanovllm.serve.errors import APIError


class JSONSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={  # "json_schema" needs its schema
            "anyOf": [
                {"properties": {"type": {"enum": ["text", "json_object"]}}},
                {
                    "required": ["json_schema"],
                    "properties": {
                        "json_schema": {
                            "type": "object",
                            "required": ["schema"],
                            "properties": {"schema": {"type": "object"}},
                        }
                    },
                },
            ]
        },
    )

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchema | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` request field."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "description": "exactly one constraint; it must compile, within 10 s, and its text "
            "(a JSON Schema as JSON, a choice list as a JSON list) may hold at most 262,144 "
            "characters (a 400 naming it if not: rules JSON Schema cannot state)",
            "oneOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in ("json", "regex", "choice", "grammar")
            ]
            + [{"required": ["json_object"], "properties": {"json_object": {"const": True}}}],
        },
    )

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: Annotated[str, Field(min_length=1)] | None = None
    choice: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False


def structured_outputs_params(
    response_format: ResponseFormat | None, structured_outputs: StructuredOutputs | None
) -> StructuredOutputsParams | None:
    """The engine's constraint for a request's two fields; an APIError (400) naming the field."""
    if response_format is not None and response_format.type == "text":
        response_format = None
    if response_format is not None and structured_outputs is not None:
        raise APIError(
            "response_format and structured_outputs cannot both be given",
            param="structured_outputs",
        )
    try:
        if structured_outputs is not None:
            fields = structured_outputs.model_dump(by_alias=True)
            return StructuredOutputsParams(**fields)
        if response_format is None:
            return None
        if response_format.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        schema = response_format.json_schema
        if schema is None or schema.json_schema is None:
            raise ValueError(
                'response_format of type "json_schema" needs json_schema.schema, got '
                f"{response_format.model_dump(by_alias=True, exclude_none=True)!r}"
            )
        return StructuredOutputsParams(json=schema.json_schema)
    except ValueError as exc:
        param = "structured_outputs" if structured_outputs is not None else "response_format"
        raise APIError(str(exc), param=param) from exc
