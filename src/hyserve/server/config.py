"""Settings of the HTTP server (the engine's own settings are ``EngineArgs``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]  # names clients may send as ``model``; the first is the default
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs ``Authorization: Bearer <api_key>``
    max_queue: int = 1024  # waiting engine requests (over all clients) beyond which new ones get 503
    shutdown_timeout: float = 30.0  # seconds to let running requests finish after SIGTERM
    max_body_bytes: int = 16 << 20  # request bodies above this get 413
    use_generation_config: bool = True  # take default sampling settings from generation_config.json
    access_log: bool = True

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("at least one non-empty served model name is needed")
        if self.max_queue < 1:
            raise ValueError(f"--max-queue must be >= 1, got {self.max_queue}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")
        if self.max_body_bytes < 1:
            raise ValueError(f"--max-body-bytes must be >= 1, got {self.max_body_bytes}")
        if self.api_key == "":
            raise ValueError("--api-key must not be empty")

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]
