"""Registry: naming tools, validating their arguments from the signature, and their JSON schemas."""

import asyncio
from typing import Any

import pytest

from agentflow import Registry
from agentflow._errors import ToolArgumentsInvalid, UnknownTool


def test_tool_name_defaults_to_the_function_name():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int) -> str:
        return f"{seats} at {show}"

    assert "hold_seats" in registry
    assert registry.get("hold_seats").fn is hold_seats


def test_name_option_overrides_the_function_name():
    registry = Registry()

    @registry.tool(name="seats.hold")
    def hold_seats(show: str) -> str:
        return show

    assert "seats.hold" in registry
    assert "hold_seats" not in registry
    assert registry.get("seats.hold").name == "seats.hold"


def test_a_duplicate_name_is_refused():
    # Given a registry that has a tool called "charge"
    registry = Registry()

    @registry.tool(name="charge")
    def charge_card(amount: int) -> str:
        return "charged"

    # When another function registers under the same name
    # Then it is refused, naming the taken name, and the first tool stays registered
    with pytest.raises(ValueError, match="'charge' is already registered"):

        @registry.tool(name="charge")
        def charge_again(amount: int) -> str:
            return "twice"

    assert registry.get("charge").fn is charge_card
    assert len(registry) == 1


def test_sync_and_async_functions_both_register():
    registry = Registry()

    @registry.tool
    def sync_tool(x: int) -> int:
        return x

    @registry.tool
    async def async_tool(x: int) -> int:
        return x

    assert registry.get("sync_tool").is_async is False
    assert registry.get("async_tool").is_async is True
    assert sorted(t.name for t in registry) == ["async_tool", "sync_tool"]


def test_decorator_returns_the_function_unchanged():
    # Given a decorated async function
    registry = Registry()

    @registry.tool(idempotent=True)
    async def double(x: int) -> int:
        return 2 * x

    # Then it can still be called directly as the plain function it was
    assert asyncio.run(double(4)) == 8


def test_arguments_are_validated_and_coerced_from_the_signature():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int, vip: bool = False) -> str:
        return show

    # When the arguments arrive as strings (as a model's JSON often sends them)
    kwargs = registry.get("hold_seats").validate({"show": "Hamlet", "seats": "2"})
    # Then they are coerced to the declared types, and defaults are filled in
    assert kwargs == {"show": "Hamlet", "seats": 2, "vip": False}
    assert type(kwargs["seats"]) is int


def test_bad_arguments_raise_naming_the_tool_and_the_field():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int) -> str:
        return show

    with pytest.raises(ToolArgumentsInvalid) as caught:
        registry.get("hold_seats").validate({"show": "Hamlet", "seats": "many"})
    assert "'hold_seats'" in str(caught.value)
    assert "seats" in str(caught.value)
    assert "show" not in str(caught.value).split("bad arguments:")[1]


def test_a_missing_argument_raises_naming_the_field():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int) -> str:
        return show

    with pytest.raises(ToolArgumentsInvalid, match=r"'hold_seats'.*seats"):
        registry.get("hold_seats").validate({"show": "Hamlet"})


def test_an_unknown_argument_is_refused():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int) -> str:
        return show

    # When a call passes an argument the function does not declare
    # Then it is refused rather than silently dropped
    with pytest.raises(ToolArgumentsInvalid, match=r"'hold_seats'.*discount"):
        registry.get("hold_seats").validate({"show": "Hamlet", "seats": 2, "discount": 10})


def test_an_unknown_tool_name_raises_unknown_tool_naming_it():
    registry = Registry()

    @registry.tool
    def known(x: int) -> int:
        return x

    with pytest.raises(UnknownTool, match="'refund_card'") as caught:
        registry.get("refund_card")
    # it also says what is registered, so a typo is easy to spot
    assert "known" in str(caught.value)
    assert isinstance(caught.value, LookupError)


def test_var_positional_tools_are_refused_at_registration():
    registry = Registry()

    with pytest.raises(TypeError, match=r"'spread'.*\*args"):

        @registry.tool
        def spread(*items: int) -> int:
            return sum(items)

    assert "spread" not in registry


def test_var_keyword_tools_are_refused_at_registration():
    registry = Registry()

    with pytest.raises(TypeError, match=r"'anything'.*\*\*kwargs"):

        @registry.tool
        def anything(**options: str) -> str:
            return ""

    assert "anything" not in registry


def test_positional_only_tools_are_refused_at_registration():
    registry = Registry()

    with pytest.raises(TypeError, match="positional-only"):

        @registry.tool
        def only(x: int, /) -> int:
            return x

    assert "only" not in registry


def test_schema_describes_parameters_required_fields_and_docstring():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int, vip: bool = False) -> str:
        """Hold seats for a show until they are paid.

        Args:
            show: the show.
            seats: how many.
            vip: front rows.
        """
        return show

    schema = registry.get("hold_seats").schema()

    assert schema["name"] == "hold_seats"
    # the description is the docstring's first paragraph only
    assert schema["description"] == "Hold seats for a show until they are paid."
    params = schema["parameters"]
    assert params["type"] == "object"
    assert params["properties"]["show"]["type"] == "string"
    assert params["properties"]["seats"]["type"] == "integer"
    assert params["properties"]["vip"]["type"] == "boolean"
    assert params["properties"]["vip"]["default"] is False
    assert sorted(params["required"]) == ["seats", "show"]
    assert params["additionalProperties"] is False


def test_schema_description_option_overrides_the_docstring():
    registry = Registry()

    @registry.tool(description="Charge the customer's card.")
    def charge_card(amount: int) -> str:
        """Internal docstring."""
        return "ok"

    assert registry.get("charge_card").schema()["description"] == "Charge the customer's card."


def test_registry_schemas_lists_every_tool_in_registration_order():
    registry = Registry()

    @registry.tool
    def hold_seats(show: str) -> str:
        """Hold seats."""
        return show

    @registry.tool
    async def charge_card(amount: int) -> str:
        """Charge the card."""
        return "ok"

    schemas = registry.schemas()

    assert [s["name"] for s in schemas] == ["hold_seats", "charge_card"]
    assert [s["description"] for s in schemas] == ["Hold seats.", "Charge the card."]
    assert schemas[1]["parameters"]["required"] == ["amount"]


def test_a_schema_is_built_once_and_each_caller_gets_a_copy_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry()

    @registry.tool
    def hold_seats(show: str) -> str:
        """Hold seats."""
        return show

    tool = registry.get("hold_seats")
    build = tool.args_model.model_json_schema
    builds: list[int] = []

    def counted() -> dict[str, Any]:
        builds.append(1)
        return build()

    monkeypatch.setattr(tool.args_model, "model_json_schema", counted)
    # Given a caller (a model adapter) that changes the schema it was handed
    first = tool.schema()
    first["parameters"]["properties"]["show"]["type"] = "integer"
    first["name"] = "changed"
    # Then the next caller still gets the tool's own schema, from the one built at the first call
    assert tool.schema()["name"] == "hold_seats"
    assert tool.schema()["parameters"]["properties"]["show"]["type"] == "string"
    assert tool.schema() is not tool.schema() and tool.schema() == registry.schemas()[0]
    assert len(builds) == 1


def test_negative_retries_are_refused():
    registry = Registry()

    with pytest.raises(ValueError, match="attempts"):

        @registry.tool(retries=-1)
        def flaky(x: int) -> int:
            return x


def test_a_non_positive_timeout_is_refused():
    registry = Registry()

    with pytest.raises(ValueError, match="'slow'.*timeout_s"):

        @registry.tool(timeout_s=0)
        def slow(x: int) -> int:
            return x
