"""Turn a store URL into one fsspec filesystem, with bounded retries and no secrets in sight.

The only per-backend knowledge in the package lives here: which protocols are accepted,
which defaults each backend gets so that failures are fast, and which exception types
mean "the store cannot be used", which storage options each accepts, and what to check
when it fails (a local path: the path and its permissions; a bucket: credentials and
endpoint). It is also the only place where those exceptions (fsspec, botocore, aiohttp,
gcsfs, google-auth, ``OSError``) become storage errors: :func:`open_backend` when the URL is
opened, :meth:`Backend.failures` for every call after.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.asyn import AsyncFileSystem

from storage.errors import StorageError, StoreUnavailable

# gcsfs reads this once, when it is first imported (fsspec imports it lazily, on the first
# gs:// URL). Its experimental zonal/HNS client probes bucket types through extra APIs that
# emulators and ordinary buckets do not need.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = ["Backend", "accepted_options", "backend_errors", "open_backend", "redact"]

# Accepted protocols and their canonical spelling.
_PROTOCOLS = {
    "file": "file",
    "local": "file",
    "memory": "memory",
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
}
_HINT = "use a local path, file://PATH, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or memory://NAME"
_BOOL_WORDS = {"true": True, "false": False}
_MiB = float(2**20)
_USERINFO = re.compile(r"^([a-z0-9+.-]+://)[^/@]*@", re.IGNORECASE)
#: Options every fsspec filesystem takes (its listings cache, its instance cache).
_COMMON_OPTIONS = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"})
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_READ_ONLY_COMMANDS = "ls, show, explain, diff, replay and verify"


@dataclass(frozen=True)
class _Hints:
    """What to check when a call fails, for one backend."""

    timeout: str
    refused: str
    failed: str


_HINTS = {
    "file": _Hints(
        timeout="check that the disk or network mount holding the path answers",
        refused=(f"check the path and its permissions: {_READ_ONLY_COMMANDS} need to read "
                 "it, run, rescore and import-adk-history also to write it (a read-only "
                 "directory or mount serves the reading commands only)"),
        failed="check that the path is right, is a directory, and that its disk has free space",
    ),
    "s3": _Hints(
        timeout=("check that the endpoint is reachable (AWS_ENDPOINT_URL or --storage-option "
                 "endpoint_url=..., network) and retry"),
        refused=("check the credentials (AWS_* variables, AWS_PROFILE, storage options) and "
                 "that their policy allows s3:ListBucket and s3:GetObject (every command) and "
                 "s3:PutObject (run, rescore, import-adk-history)"),
        failed="check the URL, the endpoint (AWS_ENDPOINT_URL) and the credentials, then retry",
    ),
    "gs": _Hints(
        timeout=("check that the endpoint is reachable (STORAGE_EMULATOR_HOST or "
                 "--storage-option endpoint_url=..., network) and retry"),
        refused=("check the credentials (GOOGLE_APPLICATION_CREDENTIALS or gcloud ADC) and "
                 "that their role allows storage.objects.list and storage.objects.get (every "
                 "command) and storage.objects.create (run, rescore, import-adk-history)"),
        failed=("check the URL, the endpoint (STORAGE_EMULATOR_HOST) and the credentials, "
                "then retry"),
    ),
    "memory": _Hints(
        timeout="retry",
        refused="check what else in this process uses the memory:// store",
        failed="check what else in this process uses the memory:// store",
    ),
}


@dataclass(frozen=True)
class Backend:
    """An opened store location, and the one place that calls its filesystem."""

    fs: AbstractFileSystem
    protocol: str  # "file" | "memory" | "s3" | "gs"
    root: str  # the store root as the filesystem spells paths (no protocol, no trailing /)
    url: str  # the store root as a URL a person can pass back in; never has credentials
    timeout: float  # seconds for one small call; transfers and listings get more

    @property
    def is_object_store(self) -> bool:
        return self.protocol in ("s3", "gs")

    @property
    def bucket(self) -> str:
        return self.root.split("/", 1)[0]

    def deadline(self, nbytes: int = 0, long: bool = False) -> float:
        return self.timeout * (6 if long else 1) + nbytes / _MiB

    def call(
        self,
        what: str,
        method: str,
        *args: Any,
        nbytes: int = 0,
        long: bool = False,
        passthrough: tuple[type[BaseException], ...] = (FileNotFoundError, FileExistsError),
        **kwargs: Any,
    ) -> Any:
        """Run one filesystem call under a deadline; map backend failures to StoreUnavailable.

        ``what`` describes the call for the error message; exceptions in ``passthrough``
        reach the caller unchanged because they mean something there.
        """
        deadline = self.deadline(nbytes, long)
        if isinstance(self.fs, AsyncFileSystem):
            kwargs["timeout"] = deadline  # consumed by fsspec's sync(): wait_for, then cancel
        with self.failures(what, deadline, passthrough):
            return getattr(self.fs, method)(*args, **kwargs)

    @contextmanager
    def failures(
        self,
        what: str,
        deadline: float | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Iterator[None]:
        """The one place where backend exceptions become :class:`StoreUnavailable`.

        Wraps every filesystem call (:meth:`call`) and every local-disk write of
        :mod:`storage.store`; exceptions in ``passthrough`` and storage errors reach the
        caller unchanged, anything else that :func:`backend_errors` does not name is a bug
        and is not disguised.
        """
        try:
            yield
        except passthrough:
            raise
        except StorageError:
            raise
        except backend_errors() as exc:
            raise self.unavailable(what, exc, self.deadline() if deadline is None else deadline) from exc

    def unavailable(self, what: str, exc: BaseException, deadline: float) -> StoreUnavailable:
        """The error for a failed call, with what to check for this backend."""
        detail = f"{type(exc).__name__}: {exc}"[:300]
        hints = _HINTS[self.protocol]
        if isinstance(exc, TimeoutError):
            reason = (f"{what} got no answer within {deadline:.0f} s (EVALSNAP_STORE_TIMEOUT="
                      f"{self.timeout:g} s per call); {hints.timeout}")
        elif isinstance(exc, PermissionError):
            reason = f"{what} was refused ({detail}); {hints.refused}"
        else:
            reason = f"{what} failed ({detail}); {hints.failed}"
        return StoreUnavailable(self.url, reason)

    def missing_bucket(self, what: str) -> StoreUnavailable:
        return StoreUnavailable(
            self.url,
            f"{what} failed: bucket {self.bucket!r} does not exist (or these credentials "
            "cannot see it); create it, or fix the URL or the credentials",
        )


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced, for error messages."""
    return _USERINFO.sub(r"\1***@", url)


def open_backend(
    url: str, storage_options: Mapping[str, str] | None = None, timeout: float = 10.0
) -> Backend:
    """Resolve ``url`` to a filesystem and root; raise :class:`StoreUnavailable` if unusable."""
    if not isinstance(url, str) or not url.strip():
        raise StoreUnavailable(repr(url), f"the store URL is empty; {_HINT}")
    url = url.strip()
    shown = redact(url)
    scheme, rest = fsspec.core.split_protocol(url)
    protocol = _PROTOCOLS.get(scheme.lower()) if scheme else "file"
    if protocol is None:
        raise StoreUnavailable(shown, f"unknown protocol {scheme!r}; {_HINT}")
    if protocol in ("s3", "gs"):
        _check_object_url(shown, rest)
    if protocol == "file":
        # Relative paths are resolved now, so the URL means the same thing from any cwd.
        rest = os.path.abspath(os.path.expanduser(rest))
    options: dict[str, Any] = {**_defaults(protocol, storage_options or {})}
    options.update(_coerce(storage_options or {}))
    try:
        _check_options(shown, protocol, storage_options or {})
        fs, root = fsspec.core.url_to_fs(f"{protocol}://{rest}", **options)
    except (ImportError, ValueError, TypeError, OSError) as exc:
        raise StoreUnavailable(
            shown, f"could not open it ({type(exc).__name__}: {exc}); {_HINT}"
        ) from exc
    root = root.rstrip("/")
    return Backend(fs, protocol, root, _display_url(protocol, root), timeout)


def _check_object_url(shown: str, rest: str) -> None:
    bucket = rest.split("/", 1)[0]
    if "@" in bucket:
        raise StoreUnavailable(
            shown,
            "credentials in the URL are not accepted; pass them through the environment "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS) "
            "or storage options",
        )
    if not bucket:
        raise StoreUnavailable(shown, f"no bucket name; {_HINT}")
    if "?" in rest or "#" in rest:
        raise StoreUnavailable(shown, "query strings and fragments are not supported in store URLs")


def _check_options(shown: str, protocol: str, options: Mapping[str, str]) -> None:
    """Refuse a storage option the backend does not take (fsspec would ignore it, or fail
    later with a TypeError): a misspelt option must not be silently dropped."""
    accepted = accepted_options(protocol)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise StoreUnavailable(
            shown,
            f"unknown storage option {unknown[0]!r}: the {protocol} backend "
            f"({fsspec.get_filesystem_class(protocol).__name__}) takes "
            f"{', '.join(sorted(accepted))}; fix or drop --storage-option {unknown[0]}=...",
        )


@functools.cache
def accepted_options(protocol: str) -> frozenset[str]:
    """The storage options the filesystem of ``protocol`` takes: the named parameters of its
    constructors (and of s3fs's botocore session, which gets whatever s3fs does not name),
    and fsspec's cache options."""
    cls = fsspec.get_filesystem_class(protocol)
    inits = [vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass)]
    if protocol == "s3":
        from aiobotocore.session import AioSession  # s3fs's dependency: present with s3fs

        inits.append(AioSession.__init__)
    names = {param.name for init in inits for param in inspect.signature(init).parameters.values()
             if param.kind in _NAMED and param.name != "self"}
    return frozenset(names | _COMMON_OPTIONS)


def _display_url(protocol: str, root: str) -> str:
    if protocol == "file":
        return root or "/"  # a plain absolute path: what Prefect's LocalFileSystem expects
    return f"{protocol}://{root.lstrip('/')}"


def _defaults(protocol: str, user: Mapping[str, str]) -> dict[str, Any]:
    """Backend options that make failures fast and keep listings fresh."""
    if protocol == "s3":
        s3: dict[str, Any] = {
            # botocore: fail a dead endpoint quickly, retry transient errors a little.
            "config_kwargs": {
                "connect_timeout": 5,
                "read_timeout": 30,
                "retries": {"max_attempts": 3, "mode": "standard"},
            },
            "use_listings_cache": False,  # other writers add objects; never list from cache
        }
        # Recent botocore reads AWS_ENDPOINT_URL itself; passing it explicitly also works on
        # older versions and keys fsspec's instance cache by the endpoint in force.
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            s3["endpoint_url"] = endpoint
        return s3
    if protocol == "gs":
        gs: dict[str, Any] = {"use_listings_cache": False}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
        if emulator and emulator != "default":
            if not emulator.startswith(("http://", "https://")):
                emulator = f"http://{emulator}"
            gs["endpoint_url"] = emulator
        if "endpoint_url" in gs or "endpoint_url" in user:
            # Emulators need no auth, and the default chain would otherwise probe the GCE
            # metadata server over the network before giving up.
            gs["token"] = "anon"
        return gs
    return {}


def _coerce(options: Mapping[str, str]) -> dict[str, Any]:
    """Storage options arrive as strings (CLI, env, config); turn true/false into bools."""
    return {
        key: _BOOL_WORDS.get(value.lower(), value) if isinstance(value, str) else value
        for key, value in options.items()
    }


def backend_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean the store failed (network, auth, server), not our code.

    Backend libraries are only consulted if already imported: a local store never pays for
    importing botocore or aiohttp.
    """
    errors: list[type[BaseException]] = [OSError, TimeoutError, ValueError]
    candidates = {
        "botocore.exceptions": ("BotoCoreError", "ClientError"),
        "aiohttp": ("ClientError",),
        "gcsfs.retry": ("HttpError",),
        "google.auth.exceptions": ("GoogleAuthError",),
    }
    for module_name, names in candidates.items():
        module = sys.modules.get(module_name)
        for name in names:
            cls = getattr(module, name, None) if module is not None else None
            if isinstance(cls, type) and issubclass(cls, BaseException):
                errors.append(cls)
    return tuple(errors)
