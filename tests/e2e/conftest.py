"""Fixtures shared by the e2e modules that start an ``octavo serve`` as their module-scoped ``server`` fixture
(a ``ServerProcess``): an OpenAI client of that server and the model id it serves. A module that needs another
client (TLS: ``test_vllm_server.py``) defines its own ``client``, which takes precedence."""

import pytest


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id
