"""``promptlookup serve --cross-request``: requests draft from and add to their tenant's index
(per tenant by default, one tenant without a key), or one for all, or none; answers are the
same either way."""

from __future__ import annotations

import pytest
from _server import FIXED, MESSAGES, MODEL, RunningServer, tiny_lm
from click.testing import CliRunner

from promptlookup.cli import main
from promptlookup.errors import InvalidParameterError
from promptlookup.server import ServerSettings, create_app


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


def ask(running: RunningServer, api_key: str = "unused") -> str:
    reply = running.client(api_key).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0
    )
    return reply.choices[0].message.content


def test_default_is_per_tenant_and_the_flag_is_documented():
    assert ServerSettings().cross_request == "per-tenant"
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--cross-request [off|per-tenant|global]" in help_text
    assert "--cross-request-tokens" in help_text


def test_the_released_spelling_per_key_still_means_per_tenant():
    assert ServerSettings(cross_request="per-key").cross_request == "per-tenant"
    with pytest.raises(InvalidParameterError, match="--cross-request"):
        ServerSettings(cross_request="per-client")


def test_each_sharing_mode_keeps_the_answers(lm):
    answers = {}
    for sharing in ("off", "per-tenant", "global"):
        settings = ServerSettings(
            api_key="k1", cross_request=sharing, model_id=MODEL, generation_options=FIXED
        )
        with RunningServer(create_app(lm, settings)) as running:
            answers[sharing] = [ask(running, "k1"), ask(running, "k1")]
            index = running.state.cross_request.for_tenant(
                running.state.tenants.tenant("Bearer k1")
            )
            if sharing == "off":
                assert index is None
            else:
                assert len(index) > 0  # both requests' outputs were added
                assert (
                    index is running.state.cross_request.for_tenant(None) or sharing == "per-tenant"
                )
    assert answers["per-tenant"] == answers["off"] == answers["global"]


def test_without_a_key_every_client_is_one_tenant(lm):
    settings = ServerSettings(model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(lm, settings)) as running:
        ask(running, "anything")
        ask(running, "something else")
        indexes = running.state.cross_request
        assert len(indexes.for_tenant(None)) > 0 and list(indexes._indexes) == [None]


def test_a_drafter_without_prompt_lookup_gets_no_index(lm):
    settings = ServerSettings(drafter="none", model_id=MODEL, generation_options=FIXED)
    with RunningServer(create_app(lm, settings)) as running:
        assert ask(running)
        assert len(running.state.cross_request.for_tenant(None)) == 0
