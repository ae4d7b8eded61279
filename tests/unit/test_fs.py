"""Locations: plain paths and URLs resolve to a pyarrow filesystem and a path;
joining keeps the filesystem options; secrets never reach messages."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from lockgate import fs
from lockgate.fs.explain import explain

S3 = "s3://KEY:SECRET@bkt/pre/fix?endpoint_override=127.0.0.1:9&scheme=http&region=eu-west-3"


def test_plain_paths_and_file_urls_are_local(tmp_path: Path) -> None:
    rel_fs, rel = fs.resolve("some/folder")
    assert isinstance(rel_fs, pafs.LocalFileSystem) and rel == os.path.abspath("some/folder")
    assert fs.local_path("some/folder") == "some/folder" and fs.is_local("some/folder")

    url = (tmp_path / "a b").as_uri()  # file:///.../a%20b
    assert url.startswith("file://") and "%20" in url
    url_fs, path = fs.resolve(url)
    assert isinstance(url_fs, pafs.LocalFileSystem) and path == str(tmp_path / "a b")
    assert fs.local_path(url) == str(tmp_path / "a b")
    assert not fs.is_object_store(url)
    assert fs.local_path(fs.join(url, "c")) == str(tmp_path / "a b" / "c")


def test_s3_url_resolves_with_its_options_and_no_network() -> None:
    s3, path = fs.resolve(S3)
    assert isinstance(s3, pafs.S3FileSystem)
    assert path == "bkt/pre/fix"
    assert s3.region == "eu-west-3"
    assert fs.is_object_store(S3) and not fs.is_local(S3) and fs.local_path(S3) is None
    # one filesystem per root: every location below it reuses its connections
    assert fs.resolve(fs.join(S3, "x"))[0] is s3


def test_join_keeps_the_query_and_quotes_names() -> None:
    chk = fs.join(S3, "job-1", "chk-3")
    assert chk == ("s3://KEY:SECRET@bkt/pre/fix/job-1/chk-3"
                   "?endpoint_override=127.0.0.1:9&scheme=http&region=eu-west-3")
    odd = fs.join(chk, "a b?#%.state")
    assert fs.resolve(odd)[1] == "bkt/pre/fix/job-1/chk-3/a b?#%.state"
    assert fs.basename(odd) == "a b?#%.state"
    assert fs.parent(odd) == chk and fs.basename(chk) == "chk-3"
    assert fs.join("s3://bkt", "x") == "s3://bkt/x"
    assert fs.resolve("s3://bkt?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1")[1] \
        == "bkt"
    assert fs.join("hdfs://namenode:8020/data/", "chk") == "hdfs://namenode:8020/data/chk"
    assert not fs.is_local("hdfs://namenode:8020/data")
    assert fs.join("rel", "a", "b") == os.path.join("rel", "a", "b")


def test_absolute_parent_and_locations_pickle() -> None:
    assert fs.absolute("chk") == os.path.abspath("chk")
    assert fs.absolute(S3) == S3
    assert fs.parent("/a/b/") == "/a" and fs.basename("/a/b/") == "b"
    assert pickle.loads(pickle.dumps(fs.join(S3, "x"))) == fs.join(S3, "x")


def test_secrets_are_redacted_from_messages() -> None:
    assert fs.redact(S3).startswith("s3://KEY:***@bkt/pre/fix?")
    assert "SECRET" not in fs.redact(S3)
    assert fs.redact("s3://bkt/x") == "s3://bkt/x"
    with pytest.raises(ValueError, match="filesystem URL") as e:
        fs.resolve("s3://KEY:SECRET@bkt/x?no_such_option=1")
    assert "SECRET" not in str(e.value)
    with pytest.raises(ValueError, match="nosuchfs://"):
        fs.resolve("nosuchfs://x/y")


def test_explain_names_the_fix() -> None:
    err = OSError("AWS Error NO_SUCH_BUCKET during PutObject operation: The specified bucket "
                  "does not exist")
    text = explain(err, S3)
    assert "bucket 'bkt' does not exist" in text and "SECRET" not in text
    text = explain(OSError("curlCode: 7, Could not connect to server"), S3)
    assert "endpoint_override" in text and "cannot be reached" in text
    text = explain(ValueError("Unable to load libjvm\ndlopen(/usr/lib/jvm...) failed"),
                      "hdfs://nn:8020/chk")
    assert "HADOOP_HOME" in text and "dlopen" not in text


def test_local_io_roundtrip(tmp_path: Path) -> None:
    root = tmp_path.as_uri()
    fs.makedirs(fs.join(root, "d", "e"))
    fs.write_atomic(fs.join(root, "d", "m"), b"meta")
    f = fs.open_write(fs.join(root, "d", "e", "f"))
    f.write(b"12345")
    fs.finish_write(f)
    assert fs.read_bytes(fs.join(root, "d", "m")) == b"meta"
    assert fs.walk_files(root) == {"d/m": 4, "d/e/f": 5}
    assert fs.list_sizes(fs.join(root, "d")) == {"m": 4, "e": None}
    fs.move(fs.join(root, "d", "m"), fs.join(root, "d", "n"))
    assert sorted(fs.listdir(fs.join(root, "d"))) == ["e", "n"]
    assert [p.name for p in (tmp_path / "d").iterdir() if p.name.startswith(".")] == []
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(fs.join(root, "nope"))
    fs.remove(fs.join(root, "nope"))
    fs.rmtree(fs.join(root, "d"))
    assert fs.listdir(root) == [] and fs.listdir(fs.join(root, "d")) == []
