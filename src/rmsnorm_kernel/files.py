"""What writing a file of the project shares, for training, the check commands and the benchmarks alike:
which refusals of a write are the disk's or the file system's."""

from __future__ import annotations

import errno

#: The errors of a write that the disk or the file system refused.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM})
