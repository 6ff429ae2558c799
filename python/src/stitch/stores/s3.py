"""``S3Store``: a run's versions and pointer under an S3 (or S3-compatible)
prefix, constructed as the original Python Stitch's ``S3Store`` is. The
layout (``<prefix>/latest``, ``<prefix>/updates/weight_vNNNNNN/``) and the
objects' ``stitch-sha256`` metadata are the original's, so either can read
what the other wrote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional
from urllib.parse import quote, urlparse

from stitch import _stitch
from stitch.errors import InvalidArgument
from stitch.stores.base import Store


class S3Store(Store):
    """``root`` is ``s3://bucket[/prefix]`` (or ``bucket[/prefix]``);
    ``cache_dir`` is where versions are materialized; ``endpoint_url`` names
    an S3-compatible service (MinIO, R2, moto...). The region is ``region``,
    else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else us-east-1.
    Credentials come from ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``
    and ``AWS_SESSION_TOKEN`` (not from boto3's other sources). Opening sends
    nothing."""

    def __init__(self, root: str, *, cache_dir: "str | os.PathLike", run_id: str,
                 endpoint_url: Optional[str] = None, region: Optional[str] = None) -> None:
        if not run_id:
            raise InvalidArgument("stitch: S3Store needs a run_id", "INVALID_ARGUMENT")
        text = root if "://" in root else f"s3://{root}"
        parsed = urlparse(text)
        if parsed.scheme != "s3" or not parsed.netloc or parsed.query or parsed.fragment:
            raise InvalidArgument(
                f"stitch: S3 root {root!r} must be s3://BUCKET[/PREFIX] (pass endpoint_url= and "
                "region= as arguments, not in the root)", "INVALID_ARGUMENT")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.cache_dir = Path(cache_dir)
        self.endpoint_url = endpoint_url
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        query = []
        if endpoint_url:
            query.append("endpoint=" + quote(endpoint_url, safe=""))
        if region:
            query.append("region=" + quote(region, safe=""))
        uri = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        if query:
            uri += "?" + "&".join(query)
        super().__init__(_stitch.open_store(uri, run_id, os.fspath(self.cache_dir)))
