"""bench.common.server_log: what a server started by start_service logged, read a stretch at a time."""
import os
import subprocess
import sys
import tempfile

from bench.common import server_log


def test_each_read_gives_what_was_logged_since_the_last_and_the_server_writes_on_at_the_end():
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-c", "print('first', flush=True)"], stdout=log, stderr=subprocess.STDOUT)
    proc.wait()
    proc.log = log
    text, end = server_log(proc)
    assert text == "first\n" and end == len(text)
    assert server_log(proc, end) == ("", end)
    os.write(log.fileno(), b"ERROR a step failed\n")  # the server's next line, through the open file it shares
    text, later = server_log(proc, end)
    assert text == "ERROR a step failed\n" and later == end + len(text)
    assert server_log(proc) == ("first\nERROR a step failed\n", later)  # nothing written over
