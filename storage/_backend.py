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

import asyncio
import base64
import functools
import inspect
import os
import re
import socket
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.asyn import AsyncFileSystem

from storage import _local
from storage.errors import StorageError, StoreUnavailable

__all__ = ["Backend", "FileInfo", "RequestCounts", "accepted_options", "backend_errors",
           "open_backend", "redact"]

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


#: With one of these set, a direct TCP connection says nothing about the endpoint's reachability.
_PROXIED = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                      "all_proxy"})

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


#: What :meth:`Backend.read_many` gives for a file found longer than its limit by its size.
OVERSIZE = b"\0oversize"

#: Request kinds, as a bucket bills them.
REQUEST_KINDS = ("list", "head", "get", "put", "delete")
#: What one filesystem method costs, in requests of one kind (per path for batch calls).
_METHOD_KINDS = {"cat_file": "get", "cat": "get", "pipe_file": "put", "pipe": "put",
                 "info": "head", "exists": "head", "ls": "list", "find": "list",
                 "rm_file": "delete", "rm": "delete"}
#: Objects per listing page (S3 ListObjectsV2 and GCS objects.list both return 1,000).
LIST_PAGE = 1000
#: Requests in flight at once for a batch of reads or writes on an object store.
BATCH_CONCURRENCY = 32


class RequestCounts:
    """Requests sent to the store, by kind (``list``, ``head``, ``get``, ``put``,
    ``delete``): what a bucket bills. Thread-safe; one per opened store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def snapshot(self) -> dict[str, int]:
        """The counts so far, every kind present (zeros included), plus ``total``."""
        with self._lock:
            out = {kind: self._counts.get(kind, 0) for kind in REQUEST_KINDS}
        out["total"] = sum(out.values())
        return out


@dataclass(frozen=True)
class FileInfo:
    """What a listing says of one file: its size and, where the backend gives one for a
    single-part upload, the MD5 of its bytes (S3 ``ETag``, GCS ``md5Hash``)."""

    size: int
    md5: str | None


@dataclass(frozen=True)
class Backend:
    """An opened store location, and the one place that calls its filesystem."""

    fs: AbstractFileSystem
    protocol: str  # "file" | "memory" | "s3" | "gs"
    root: str  # the store root as the filesystem spells paths (no protocol, no trailing /)
    url: str  # the store root as a URL a person can pass back in; never has credentials
    timeout: float  # seconds for one small call; transfers and listings get more
    requests: RequestCounts = field(default_factory=RequestCounts, compare=False)
    endpoint: str | None = None  # an endpoint set explicitly (emulator, MinIO, proxy-less)

    @property
    def is_object_store(self) -> bool:
        return self.protocol in ("s3", "gs")

    @property
    def bucket(self) -> str:
        return self.root.split("/", 1)[0]

    def typed(self, content_type: str | None) -> dict[str, str]:
        """The write keyword that sets an object's ``Content-Type`` on this backend (s3fs
        and gcsfs spell it differently; a local file has none)."""
        if content_type is None:
            return {}
        return ({"ContentType": content_type} if self.protocol == "s3" else
                {"content_type": content_type} if self.protocol == "gs" else {})

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
        if method == "cat_file" and self.protocol == "s3":
            kwargs.setdefault("max_concurrency", 1)  # else s3fs asks for the size first (HEAD)
        kind = _METHOD_KINDS.get(method)
        if kind is not None:
            self.requests.add(kind, len(args[0]) if method in ("cat", "pipe") and args
                              and isinstance(args[0], list | dict) else 1)
        with self.failures(what, deadline, passthrough):
            result = getattr(self.fs, method)(*args, **kwargs)
        if method == "find" and self.is_object_store and isinstance(result, list | dict):
            self.requests.add("list", max(0, (len(result) - 1) // LIST_PAGE))  # more pages
        return result

    def read_many(self, what: str, paths: list[str], *, limit: int | None = None
                  ) -> dict[str, bytes | None]:
        """The bytes of each path (None where it does not exist), read concurrently on
        object stores (at most :data:`BATCH_CONCURRENCY` in flight), one GET each and no
        HEAD. ``limit``: a file longer than this many bytes reads as at most ``limit + 1``
        bytes (a ranged GET: a planted huge file is never downloaded; a local one is not
        read at all), so that the caller sees it is too long."""
        if not paths:
            return {}
        self.requests.add("get", len(paths))
        if not isinstance(self.fs, AsyncFileSystem):
            out: dict[str, bytes | None] = {}
            with self.failures(what):
                for path in paths:
                    if self.protocol == "file":  # never through a link out of the store
                        _local.confine(self.root, path, final=True)
                    try:
                        out[path] = _read_local(self.fs, path, limit)
                    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                        out[path] = None
                    except _Oversize:
                        out[path] = OVERSIZE
            return out
        kwargs: dict[str, Any] = {}
        if limit is not None:
            kwargs.update(start=0, end=limit + 1)
        elif self.protocol == "s3":
            kwargs["max_concurrency"] = 1
        results = self._gather(what, [self.fs._cat_file(p, **kwargs) for p in paths],
                               nbytes=0 if limit is None else limit)
        return {path: self._read_result(what, path, value)
                for path, value in zip(paths, results, strict=True)}

    def write_many(self, what: str, items: dict[str, bytes], *, create: bool,
                   content_type: str | None = None) -> dict[str, bool]:
        """Write each path (``create``: only if absent); concurrently on object stores. Returns
        per path whether it was written (False: it existed already, with ``create``).
        ``content_type``: the objects' ``Content-Type`` on a bucket."""
        if not items:
            return {}
        self.requests.add("put", len(items))
        kwargs: dict[str, Any] = {"mode": "create"} if create else {}
        kwargs |= self.typed(content_type)
        if isinstance(self.fs, AsyncFileSystem):
            coros = [self.fs._pipe_file(p, data, **kwargs) for p, data in items.items()]
            results = self._gather(what, coros, nbytes=sum(len(d) for d in items.values()))
        else:
            results = []
            for path, data in items.items():
                try:
                    results.append(self.fs.pipe_file(path, data, **kwargs))
                except Exception as exc:  # noqa: BLE001 - judged below, as for async results
                    results.append(exc)
        out: dict[str, bool] = {}
        for path, value in zip(items, results, strict=True):
            if isinstance(value, FileExistsError) and create:
                out[path] = False
            elif isinstance(value, BaseException):
                if isinstance(value, FileNotFoundError):
                    raise self.missing_bucket(what) from value
                with self.failures(what):
                    raise value
            else:
                out[path] = True
        return out

    def listing(self, what: str, base: str) -> dict[str, FileInfo]:
        """Every file under ``base`` (recursively) with its size and MD5 where the backend
        lists one: one request per 1,000 files on a bucket."""
        try:
            found = self.call(what, "find", base, detail=True, long=True)
        except FileNotFoundError:
            return {}
        return {str(path): FileInfo(int(info.get("size") or 0), _md5_of(info))
                for path, info in found.items() if info.get("type", "file") == "file"}

    def _gather(self, what: str, coros: list[Any], nbytes: int) -> list[Any]:
        per_call = self.deadline(0, long=True)

        async def run() -> list[Any]:
            sem = asyncio.Semaphore(BATCH_CONCURRENCY)

            async def one(coro: Any) -> Any:
                async with sem:
                    return await asyncio.wait_for(coro, per_call)

            return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)

        from fsspec.asyn import sync

        with self.failures(what, self.deadline(nbytes, long=True) * 4):
            return list(sync(self.fs.loop, run, timeout=self.deadline(nbytes, long=True)
                             * max(1, len(coros) // BATCH_CONCURRENCY + 1)))

    def _read_result(self, what: str, path: str, value: Any) -> bytes | None:
        if isinstance(value, FileNotFoundError | IsADirectoryError):
            return None
        if isinstance(value, BaseException):
            if _unsatisfiable_range(value):
                return b""  # a ranged GET of an empty object: S3 and GCS answer 416
            with self.failures(f"{what} ({path})"):
                raise value
        return bytes(value)

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

    def refuse_dead_endpoint(self) -> None:
        """Raise :class:`StoreUnavailable` at once when nothing listens at an endpoint set
        explicitly (a refused TCP connection is final; the backends would retry it with
        backoff until the call's deadline, 10-40 s). Anything else (a slow or filtered
        network, a proxy in the way) is left to the real call and its deadline."""
        if not self.endpoint or _PROXIED.intersection(os.environ):
            return
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=min(self.timeout, 5)).close()
        except ConnectionRefusedError as exc:
            hints = _HINTS.get(self.protocol, _HINTS["file"])
            raise StoreUnavailable(
                self.url, f"nothing answers at the endpoint {redact(self.endpoint)} "
                f"(connection refused); {hints.timeout}") from exc
        except OSError:
            return

    def missing_bucket(self, what: str) -> StoreUnavailable:
        return StoreUnavailable(
            self.url,
            f"{what} failed: bucket {self.bucket!r} does not exist (or these credentials "
            "cannot see it); create it, or fix the URL or the credentials",
        )


def _unsatisfiable_range(exc: BaseException) -> bool:
    text = str(exc)
    return ("InvalidRange" in text or getattr(exc, "code", None) == 416
            or ("range" in text.lower() and "satisf" in text.lower()))


def _read_local(fs: AbstractFileSystem, path: str, limit: int | None) -> bytes:
    if limit is None:
        return bytes(fs.cat_file(path))
    with fs.open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)  # where it can, the size before the bytes
        size = handle.tell()
        if size > limit:
            raise _Oversize(path)
        handle.seek(0)
        # one byte more than the file has (a file grown since is still found too long), never
        # limit + 1: a read of n bytes allocates n first (a GiB per record read)
        return bytes(handle.read(size + 1))


class _Oversize(Exception):
    """A local file longer than the limit of a read (found by its size: nothing read)."""


def _md5_of(info: Mapping[str, Any]) -> str | None:
    """The MD5 (hex) of a listed file's bytes, where the listing proves it: an S3 ETag of a
    single-part upload (multipart ETags have a ``-``), a GCS ``md5Hash`` (base64)."""
    md5 = info.get("md5Hash")  # GCS (its own "etag" is not an MD5)
    if isinstance(md5, str):
        try:
            raw = base64.b64decode(md5, validate=True)
        except (ValueError, TypeError):
            return None
        return raw.hex() if len(raw) == 16 else None
    etag = info.get("ETag")  # S3
    if isinstance(etag, str):
        etag = etag.strip('"').lower()
        return etag if re.fullmatch(r"[0-9a-f]{32}", etag) else None
    return None

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
    if protocol == "gs" and "gcsfs" not in sys.modules:
        # gcsfs reads this once, when it is first imported (fsspec imports it on the first
        # gs:// URL, i.e. now). Its experimental zonal/HNS client probes bucket types through
        # APIs emulators and ordinary buckets do not need (60 s per call on an emulator).
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
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
    endpoint = options.get("endpoint_url")
    return Backend(fs, protocol, root, _display_url(protocol, root), timeout,
                   endpoint=endpoint if isinstance(endpoint, str) else None)


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
