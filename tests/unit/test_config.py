import pytest

from bootseer.config import BootseerConfig, parse_size
from bootseer.errors import ConfigError


def test_defaults_are_valid():
    cfg = BootseerConfig.from_env({})
    assert cfg.fetch.retries >= 0
    assert cfg.cache.budget_bytes > 0


def test_env_overrides_toml(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[fetch]\nretries = 2\ntimeout_s = 1.5\n[cache]\nbudget_bytes = "1MiB"\n')
    cfg = BootseerConfig.from_env({"BOOTSEER_CONFIG": str(toml), "BOOTSEER_FETCH_RETRIES": "7",
                                   "BOOTSEER_FETCH_VERIFY": "off"})
    assert cfg.fetch.retries == 7
    assert cfg.fetch.timeout_s == 1.5
    assert cfg.fetch.verify is False
    assert cfg.cache.budget_bytes == 1024 * 1024


def test_bad_values_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="fetch.retries"):
        BootseerConfig.from_env({"BOOTSEER_FETCH_RETRIES": "many"})
    # a size names the forms it takes (not "not a valid int"), from the environment or a file
    with pytest.raises(ConfigError, match=r"cache.budget_bytes: 'lots' is not a size: bytes "
                       r"\(1048576\) or a number with a unit \(512MiB, 10GiB"):
        BootseerConfig.from_env({"BOOTSEER_CACHE_BUDGET_BYTES": "lots"})
    sized = tmp_path / "sized.toml"
    sized.write_text('[cache]\nbudget_bytes = "12XB"\n')
    with pytest.raises(ConfigError, match="'12XB' is not a size: bytes"):
        BootseerConfig.from_env({"BOOTSEER_CONFIG": str(sized)})
    assert BootseerConfig.from_env({"BOOTSEER_CACHE_BUDGET_BYTES": "1.5GiB"}).cache \
        .budget_bytes == int(1.5 * 2**30)
    toml = tmp_path / "c.toml"
    toml.write_text("[fetch]\nnope = 1\n")
    with pytest.raises(ConfigError, match="fetch.nope"):
        BootseerConfig.from_env({"BOOTSEER_CONFIG": str(toml)})


def test_a_bad_value_says_what_the_setting_takes_and_where_it_was_set(tmp_path):
    """The variable or the file that set it, and the form the setting takes."""
    cases = {"BOOTSEER_FETCH_RETRIES": ("x", r"'x' is not a whole number"),
             "BOOTSEER_FETCH_TIMEOUT_S": ("soon", r"'soon' is not a number"),
             "BOOTSEER_FETCH_VERIFY": ("maybe", r"'maybe' is not true or false "
                                                r"\(also 1/0, yes/no, on/off\)")}
    for var, (raw, said) in cases.items():
        with pytest.raises(ConfigError, match=said + rf" \(from {var}\)$"):
            BootseerConfig.from_env({var: raw})
    node, user = tmp_path / "node.toml", tmp_path / "user.toml"
    node.write_text("[fetch]\nretries = \"few\"\n")
    user.write_text("[fetch]\nretries = 3\n")
    env = {"BOOTSEER_SYSTEM_CONFIG": str(node), "BOOTSEER_CONFIG": str(user)}
    with pytest.raises(ConfigError, match=rf"'few' is not a whole number \(in {node}\)$"):
        BootseerConfig.from_env(env)   # wrong in the node's file, even where the user's wins
    node.write_text("[cach]\n")
    with pytest.raises(ConfigError, match=rf"cach: unknown section .* \(in {node}\)$"):
        BootseerConfig.from_env(env)


def test_parse_size():
    assert parse_size("64MiB") == 64 * 2**20
    assert parse_size("1.5G") == 1_500_000_000
    with pytest.raises(ConfigError):
        parse_size("x")


def test_every_setting_is_documented():
    """docs/configuration.md lists every variable (the docstring of bootseer.config says so)."""
    import dataclasses
    import typing
    from pathlib import Path
    doc = (Path(__file__).parents[2] / "docs/configuration.md").read_text()
    hints = typing.get_type_hints(BootseerConfig)
    missing = [f"BOOTSEER_{f.name.upper()}_{sf.name.upper()}"
               for f in dataclasses.fields(BootseerConfig)
               for sf in dataclasses.fields(hints[f.name])
               if f"`BOOTSEER_{f.name.upper()}_{sf.name.upper()}`" not in doc]
    assert not missing, f"not in docs/configuration.md: {missing}"
