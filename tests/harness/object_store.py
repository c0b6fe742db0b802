"""An S3 endpoint for the tests: moto's server (``moto[server]``, from PyPI),
an HTTP S3 API in memory, in a thread of the test process, on 127.0.0.1.

How faithful it is, for what the Iceberg target does on an object store: it
serves the S3 REST API that pyarrow's S3 file system (pyiceberg's file IO)
and Hadoop's s3a speak, path-style: PUT, GET (with ranges), HEAD, LIST (v2,
with delimiters and continuation), DELETE and batch delete, multipart uploads
(pyarrow uploads every file as one). Objects appear whole when their upload
completes and a listing is consistent at once, as on Amazon S3 since 2020.
Not modelled: request rates and throttling (503 SlowDown), latency, partial
failures of a multipart upload, eventual consistency of other stores;
credentials are accepted whatever they are (nothing checks a signature's key).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

ACCESS_KEY, SECRET_KEY, REGION = "eos-test", "eos-test-secret", "us-east-1"


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3 endpoint and the credentials its clients give."""

    url: str  # http://127.0.0.1:PORT

    def io_properties(self) -> dict[str, str]:
        """pyiceberg's file IO properties that reach it (as a catalog connection's extras would give them)."""
        return {"s3.endpoint": self.url, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY,
                "s3.region": REGION}

    def create_bucket(self, name: str) -> str:
        """``s3://name``, made (nothing if it exists)."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


def start_s3():
    """(the server, its endpoint); stop the server with ``server.stop()``."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, S3Endpoint(f"http://{host}:{port}")
