"""The four agents: their npm packages (pinned), and for each how it is pointed at a server
as its documentation says for a local one: environment variables, a config file in its own
home folder under the scratch folder (nothing touches the user's own configuration), and the
non-interactive command line with a bound on its turns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: The agents' npm packages at the versions this check was last run with.
PACKAGES = {
    "claude-code": ("@anthropic-ai/claude-code", "2.1.332"),
    "codex": ("@openai/codex", "0.171.0"),
    "qwen-code": ("@qwen-code/qwen-code", "0.24.4"),
    "opencode": ("opencode-ai", "1.18.33"),
}
#: The name every agent is set up to send as ``model`` (served through --model-alias).
MODEL_NAME = "gemma-3-270m"
#: The dummy key the agents send (the server under test takes any, having none set).
API_KEY = "sk-local"


def npm_specs() -> list[str]:
    """``npm install`` arguments for every agent at its pinned version."""
    return [f"{package}@{version}" for package, version in PACKAGES.values()]


@dataclass
class Launch:
    """How one agent is run: ``argv`` in ``cwd`` with ``env`` added to a clean environment."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def _home_env(home: Path) -> dict[str, str]:
    """A home of the agent's own: every XDG folder inside it."""
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }


def claude_code(bin_dir: Path, base_url: str, home: Path, repo: Path, task: str, turns: int):
    """Claude Code: ``claude -p`` with ANTHROPIC_BASE_URL and ANTHROPIC_AUTH_TOKEN; every model
    it may pick (main, small/fast, the haiku/sonnet/opus defaults) set to MODEL_NAME. As root it
    refuses to skip permissions, so edits are accepted and the file and shell tools allowed."""
    env = {
        **_home_env(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": API_KEY,
        "ANTHROPIC_MODEL": MODEL_NAME,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL_NAME,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL_NAME,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL_NAME,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL_NAME,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, updates, reports
        "DISABLE_AUTOUPDATER": "1",
    }
    argv = [
        str(bin_dir / "claude"),
        "-p",
        task,
        "--model",
        MODEL_NAME,
        "--max-turns",
        str(turns),
        "--output-format",
        "json",
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        "Bash",
        "Read",
        "Edit",
        "Write",
        "Glob",
        "Grep",
    ]
    return Launch(argv, env, repo)


def codex_config(base_url: str) -> str:
    """Codex's ``config.toml``: a model provider speaking the Responses API at ``base_url``,
    everything else (web search included) left at Codex's defaults."""
    return (
        f'model = "{MODEL_NAME}"\n'
        'model_provider = "promptlookup"\n'
        "\n"
        "[model_providers.promptlookup]\n"
        'name = "promptlookup"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "PROMPTLOOKUP_API_KEY"\n'
    )


def codex(bin_dir: Path, base_url: str, home: Path, repo: Path, task: str, turns: int):
    """Codex: ``codex exec`` with its config in CODEX_HOME; the workspace-write sandbox lets it
    edit the scratch repository (it has no turn limit of its own: the harness counts)."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    env = {**_home_env(home), "CODEX_HOME": str(codex_home), "PROMPTLOOKUP_API_KEY": API_KEY}
    argv = [
        str(bin_dir / "codex"),
        "exec",
        "--json",
        "--sandbox",
        "workspace-write",
        "-C",
        str(repo),
        task,
    ]
    return Launch(argv, env, repo)


def qwen_settings() -> dict:
    """Qwen Code's ``~/.qwen/settings.json``: its OpenAI-compatible auth, no usage statistics."""
    return {
        "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }


def qwen_code(bin_dir: Path, base_url: str, home: Path, repo: Path, task: str, turns: int):
    """Qwen Code: ``qwen`` with a positional prompt and OPENAI_BASE_URL, OPENAI_API_KEY and
    OPENAI_MODEL; --yolo runs its tools without asking, --max-session-turns bounds it."""
    settings = home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(qwen_settings(), indent=2))
    env = {
        **_home_env(home),
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_MODEL": MODEL_NAME,
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    }
    argv = [
        str(bin_dir / "qwen"),
        "--auth-type",
        "openai",
        "--yolo",
        "--max-session-turns",
        str(turns),
        task,
    ]
    return Launch(argv, env, repo)


def opencode_config(base_url: str, turns: int) -> dict:
    """opencode's config: an OpenAI-compatible provider (``@ai-sdk/openai-compatible``, chat
    completions) at ``base_url`` with Gemma 3 270M's context, file edits and the shell allowed,
    at most ``turns`` steps of its build agent."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "promptlookup": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "promptlookup",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": API_KEY},
                "models": {
                    MODEL_NAME: {
                        "name": "Gemma 3 270M",
                        "limit": {"context": 32768, "output": 4096},
                    }
                },
            }
        },
        "model": f"promptlookup/{MODEL_NAME}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow"},
        "agent": {"build": {"steps": turns}},
    }


def opencode(bin_dir: Path, base_url: str, home: Path, repo: Path, task: str, turns: int):
    """opencode: ``opencode run`` with OPENCODE_CONFIG naming the config file above."""
    config = home / "opencode.json"
    home.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(opencode_config(base_url, turns), indent=2))
    env = {**_home_env(home), "OPENCODE_CONFIG": str(config), "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    argv = [str(bin_dir / "opencode"), "run", "--model", f"promptlookup/{MODEL_NAME}", task]
    return Launch(argv, env, repo)


#: Each agent's launcher: (bin_dir, base_url, home, repo, task, turns) -> Launch.
LAUNCHERS = {
    "claude-code": claude_code,
    "codex": codex,
    "qwen-code": qwen_code,
    "opencode": opencode,
}
