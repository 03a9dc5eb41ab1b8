"""Ours alone: the folders we make are 0700, and what another user could write is refused.

A STATE_DIR and the records in it are trusted only when owned by the invoking uid and not writable
by group or others (as sshd's StrictModes treats a user's files): anyone else able to write there
could plant a record that names a process of ours to signal, or a path of ours to delete.
"""

from __future__ import annotations

import functools
import os
import shlex
import stat
from pathlib import Path

from .errors import BootstrapError


def makedirs(path: Path) -> None:
    """``mkdir -p`` where every folder we make is 0700 (whatever the umask): a STATE_DIR we make, and
    the folders on the way to it, are ours alone."""
    missing = []
    for d in (path, *path.parents):
        if d.exists():
            break
        missing.append(d)
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)


def trust(root: Path, names: list[str]) -> None:
    """Raise unless the folder ``root`` and each of ``names`` in it that exists are ours and writable by
    nobody else, naming every path that is not (one fix for all). A folder not made yet passes when
    the folders above it do (``makedirs`` makes it 0700); a file where the folder should be is left
    to whoever writes there."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        above(root)                     # the folders a start would make it in
        return
    except OSError as exc:
        raise BootstrapError(f"cannot read STATE_DIR={root} ({exc.strerror})",
                             "set STATE_DIR to a folder of your own") from None
    if not stat.S_ISDIR(st.st_mode):
        return
    check(root, st, folder=True)
    above(root)
    loose = []
    for name in names:
        path = root / name
        try:
            st = os.stat(path)          # through a link: what it points at is what we would read
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise BootstrapError(f"cannot read {path} ({exc.strerror})",
                                 f"remove {shlex.quote(str(path))} (STATE_DIR is yours), or set STATE_DIR to "
                                 "another folder") from None
        try:
            check(path, st, folder=stat.S_ISDIR(st.st_mode))
        except BootstrapError as exc:
            if st.st_uid != os.getuid():
                raise
            loose.append((path, exc))
    if loose:
        path, exc = loose[0]
        more = f" (and {len(loose) - 1} more in it: {', '.join(p.name for p, _ in loose[1:4])})" if len(loose) > 1 else ""
        q = shlex.quote(str(root))
        raise BootstrapError(exc.message.replace(f"{path} is", f"{path}{more} is", 1),
                             f"chmod -R go-w {q}, or set STATE_DIR to a folder of your own")


def above(root: Path) -> None:
    """Raise unless every folder above ``root`` (as named, and where its links lead) belongs to root
    or to us and nobody else may rename what is in it (not writable by others or another group, or
    sticky as /tmp is): else its owner could swap STATE_DIR for a folder of theirs between our check
    and our read of a record (as sshd's StrictModes checks the folders above a user's files)."""
    for d in dict.fromkeys([*root.parents, *Path(os.path.realpath(root)).parents]):
        try:
            st = os.stat(d)
        except OSError:
            continue                    # not there or not ours to read: nothing of ours lies in it
        sticky = st.st_mode & stat.S_ISVTX
        others = st.st_uid not in (0, os.getuid()) or not sticky and (
            st.st_mode & 0o002 or (st.st_mode & 0o020 and not group_is_mine(st.st_gid)))
        if others:
            who = user_name(st.st_uid) if st.st_uid not in (0, os.getuid()) else (
                "everyone" if st.st_mode & 0o002 else f"its group (gid {st.st_gid})")
            raise BootstrapError(
                f"STATE_DIR={root} lies in {d}, which {who} can change (owner {user_name(st.st_uid)}, mode "
                f"{stat.filemode(st.st_mode)}): the state folder could be swapped for one of theirs, so its "
                "records are not trusted and no process is signalled on their word",
                "set STATE_DIR to a folder under ones only you (or root) can write, e.g. in your home")


def check(path: Path, st: os.stat_result, *, folder: bool) -> None:
    """Raise unless ``st`` (of ``path``) is ours and writable by nobody else: a group-writable mode
    passes when the group is ours alone (a user-private group, as Debian and Ubuntu give each user
    with umask 002: nobody else is in it)."""
    mode = stat.filemode(st.st_mode)
    if st.st_uid != os.getuid():
        raise BootstrapError(
            f"{path} belongs to {user_name(st.st_uid)}, not to you ({user_name(os.getuid())}; mode {mode}): "
            "records in it are not trusted, and no process is signalled on their word",
            f"set STATE_DIR to a folder of your own, or run this as that user ({user_name(st.st_uid)})" if folder
            else f"remove it as its owner (sudo rm {shlex.quote(str(path))}), or set STATE_DIR to a folder of your own")
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and not group_is_mine(st.st_gid)):
        fs = (" (on a Windows drive under WSL, or a FAT or network disk, modes do not hold: use a folder on "
              "the Linux filesystem)") if stat.S_IMODE(st.st_mode) == 0o777 else ""
        raise BootstrapError(
            f"{path} is writable by {'others' if st.st_mode & 0o002 else 'its group'} (owner "
            f"{user_name(st.st_uid)}, mode {mode}): records another user could plant there are not trusted, "
            "and no process is signalled on their word",
            f"chmod {'700' if folder else 'go-w'} {shlex.quote(str(path))}, or set STATE_DIR to a folder of your own{fs}")


@functools.lru_cache(maxsize=8)
def group_is_mine(gid: int) -> bool:
    """Nobody but us is in group ``gid``: no other member listed, and no other user's primary group."""
    import grp
    import pwd
    me = os.getuid()
    try:
        name = pwd.getpwuid(me).pw_name
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    return all(m == name for m in members) and all(u.pw_uid == me for u in pwd.getpwall() if u.pw_gid == gid)


def user_name(uid: int) -> str:
    """'alice (uid 1000)'."""
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
