"""Data files: everything that reads, writes or checks a file under the data root.

- ``paths``: what a payload may name under the root, and the one name of the file it reaches;
- ``nofollow``: opening a path beneath the root without following any symlink;
- ``durable``: ``DataFile``, the one atomic, durable write and delete, and reading a data file;
- ``locks``: the per-path lock every change of a data file holds;
- ``dirsync``: directory fsyncs shared by the jobs of one group commit;
- ``effects``: ``write_locked``/``delete_locked``, the one way a handler changes a data file,
  and ``file_error``, the one mapping from a file system error to a job's outcome;
- ``existence`` and ``content``: the reconciler's probes of data files.
"""
