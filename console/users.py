"""Users and roles from a YAML file with argon2 password hashes; ``hash-password`` makes one.

```yaml
users:
  alice: {role: agent, agent_id: "1001", password_hash: "$argon2id$v=19$..."}
  bob:   {role: supervisor, password_hash: "$argon2id$..."}
  root:  {role: admin, password_hash: "$argon2id$..."}
  carol: {role: agent}      # no hash: can only come in through the trusted proxy header
```
"""

from __future__ import annotations

import getpass
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from pydantic import BaseModel, ConfigDict, Field

from asr_common.yamlconf import load_yaml_model

Role = Literal["agent", "supervisor", "admin"]
ROLE_RANK: dict[str, int] = {"agent": 0, "supervisor": 1, "admin": 2}
_HASHER = PasswordHasher()
# verified against when the user is unknown, so a wrong name costs as long as a wrong password
_DUMMY_HASH = _HASHER.hash("not a password")


class UserEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    password_hash: str | None = Field(None, pattern=r"^\$argon2(id|i|d)\$")
    agent_id: str | None = Field(None, description="the agent id in call metadata; default: the user name")


class UsersFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: dict[str, UserEntry] = Field(default_factory=dict)


@dataclass(frozen=True)
class User:
    name: str
    role: Role
    agent_id: str

    def at_least(self, role: Role) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]


class Users:
    """The users file, re-read when it changes (checked on each login)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime = -1
        self._users: dict[str, UserEntry] = {}
        self._load()

    def _load(self) -> None:
        mtime = self.path.stat().st_mtime_ns
        if mtime != self._mtime:
            self._users = load_yaml_model(self.path, UsersFile).users  # ConfigError: file:line
            self._mtime = mtime

    def get(self, name: str) -> User | None:
        entry = self._users.get(name)
        if entry is None:
            return None
        return User(name, entry.role, entry.agent_id or name)

    def authenticate(self, name: str, password: str) -> User | None:
        """The user when ``password`` matches their hash, else None (same cost either way)."""
        self._load()
        entry = self._users.get(name)
        stored = entry.password_hash if entry is not None and entry.password_hash else _DUMMY_HASH
        try:
            _HASHER.verify(stored, password)
        except (VerificationError, InvalidHashError):
            return None
        return self.get(name) if entry is not None and entry.password_hash else None


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


def hash_password_main(argv: list[str]) -> int:
    """``asr-console hash-password``: read a password (prompt, or one line on stdin) and print its hash."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: asr-console hash-password  (reads the password from the terminal or stdin)")
        return 0
    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("empty password refused", file=sys.stderr)
        return 1
    print(hash_password(password))
    return 0
