"""The lake's file operations on any Hadoop file system, through Spark's JVM.

``hdfs://``, ``s3a://``, ``abfs://``, ``gs://`` and ``file://`` roots all go through the
Hadoop ``FileSystem`` API that Spark already carries, with the Hadoop configuration of the
running session (credentials, endpoints): no native client is needed in Python.

The commit point needs one atomic step. On HDFS (and the local file system) a rename to
a name that does not exist is atomic; the record is written to a temporary name first
and renamed only when the final name is absent. Object stores without atomic rename
(s3a) give no such guarantee: use a committer-backed file system or a local/HDFS lake
for the commit records there.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class HadoopFS:
    """The subset of file operations :class:`slotlake.lake.Lake` needs."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]

    def _path(self, p: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(p)

    def _fs(self, p: str) -> Any:
        return self._path(p).getFileSystem(self._conf)

    def join(self, root: str, relative: str) -> str:
        return root.rstrip("/") + "/" + relative

    def exists(self, p: str) -> bool:
        return bool(self._fs(p).exists(self._path(p)))

    def isdir(self, p: str) -> bool:
        fs, path = self._fs(p), self._path(p)
        return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())

    def listdir(self, p: str) -> list[str]:
        if not self.isdir(p):
            return []
        return sorted(str(st.getPath().getName()) for st in self._fs(p).listStatus(self._path(p)))

    def read_text(self, p: str) -> str:
        stream = self._fs(p).open(self._path(p))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def _write(self, p: str, text: str) -> None:
        out = self._fs(p).create(self._path(p), False)
        try:
            out.write(bytearray(text.encode("utf-8")))
            out.hsync()
        finally:
            out.close()

    def _tmp_beside(self, p: str) -> str:
        parent, _, name = p.rpartition("/")
        return f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp"

    def create_new(self, p: str, text: str) -> None:
        """Write ``p`` atomically; FileExistsError if it exists (never overwrites)."""
        fs = self._fs(p)
        if fs.exists(self._path(p)):
            raise FileExistsError(p)
        tmp = self._tmp_beside(p)
        self._write(tmp, text)
        # rename refuses an existing target on HDFS; the check above covers file systems
        # whose rename would replace it (the advisory lock rules out a concurrent writer).
        if not fs.rename(self._path(tmp), self._path(p)):
            fs.delete(self._path(tmp), False)
            raise FileExistsError(p)

    def replace(self, p: str, text: str) -> None:
        """Write ``p`` over an existing file: written aside, then swapped in."""
        fs = self._fs(p)
        tmp = self._tmp_beside(p)
        self._write(tmp, text)
        fs.delete(self._path(p), False)
        if not fs.rename(self._path(tmp), self._path(p)):
            raise OSError(f"could not rename {tmp} to {p}")

    def rmtree(self, p: str) -> None:
        self._fs(p).delete(self._path(p), True)

    def mkdirs(self, p: str) -> None:
        self._fs(p).mkdirs(self._path(p))

    def upload_dir(self, local_dir: str, p: str) -> None:
        """Copy a local directory's files to ``p`` (raw batches are written locally first)."""
        self._fs(p).copyFromLocalFile(False, True, self._path("file://" + local_dir), self._path(p))

    def download_dir(self, p: str, local_dir: str) -> None:
        self._fs(p).copyToLocalFile(False, self._path(p), self._path("file://" + local_dir), True)
