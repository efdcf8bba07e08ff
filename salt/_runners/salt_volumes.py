"""
Answers salt-volumes' question "may this Salt user change volumes on these
minions?" with the master's own authorisation: the user's ACL from
``external_auth`` (their own entries and their groups'), matched against
the minions by the master's matcher, exactly as the master checks a job the
user would publish. The control plane calls it through salt-api with its
own account, which the master config grants ``@runner:
^salt_volumes\\.access$``; it never sees or stores the user's password.

Put this file where the master finds runners: ``salt-run
saltutil.sync_runners`` copies ``_runners`` from the file roots, or list the
directory in ``runner_dirs``.
"""

import logging

import salt.auth
import salt.utils.minions

log = logging.getLogger(__name__)

__virtualname__ = "salt_volumes"

# The function the control plane's state runs call on a node: a user whose
# ACL grants it on a minion may have volumes made and removed there.
NODE_FUNCTION = "salt_volumes.apply_volume"


def __virtual__():
    return __virtualname__


def _grants(auth_list):
    # The ACL entries that name our node function (or a pattern covering
    # it), for a refusal that says what the user has.
    ckm = salt.utils.minions.CkMinions(__opts__)
    out = []
    for entry in auth_list or []:
        if isinstance(entry, str):
            if ckm.match_check(entry, NODE_FUNCTION):
                out.append("*")
        elif isinstance(entry, dict) and len(entry) == 1:
            target, funs = next(iter(entry.items()))
            if not isinstance(target, str) or target.startswith("@"):
                continue
            names = [f if isinstance(f, str) else next(iter(f)) for f in (funs or []) if isinstance(f, (str, dict))]
            if any(ckm.match_check(f, NODE_FUNCTION) for f in names):
                out.append(target)
    return out


def access(person, backend, minions=None):
    """
    For Salt user ``person`` of eauth backend ``backend``: their groups, and
    for each minion id in ``minions`` whether their ACL grants
    ``salt_volumes.apply_volume`` on it. (Not ``user`` and ``eauth``: salt-api
    takes those keys as the caller's own credentials.)

    CLI Example:

    .. code-block:: bash

        salt-run salt_volumes.access alice pam minions='[node-1, node-2]'
    """
    user, eauth = person, backend
    if not isinstance(user, str) or not user or not isinstance(eauth, str) or not eauth:
        return {"error": "person and backend: give a Salt user name and its eauth backend"}
    if eauth not in __opts__.get("external_auth", {}):
        return {"error": f"eauth {eauth!r} is not configured on this master (external_auth)"}
    if isinstance(minions, str):
        minions = [minions]
    loadauth = salt.auth.LoadAuth(__opts__)
    load = {"eauth": eauth, "username": user}
    try:
        groups = loadauth.get_groups(load) or []
    except Exception as exc:  # pylint: disable=broad-except
        # A backend that needs the password to list groups (an LDAP bind
        # as the user): the user's own entries still apply.
        log.debug("salt_volumes.access: groups of %s (%s) not available: %s", user, eauth, exc)
        groups = []
    if not isinstance(groups, (list, tuple, set)):
        groups = []
    groups = sorted(str(g) for g in groups)
    auth_list = loadauth.get_auth_list(load, {"name": user, "eauth": eauth, "groups": groups}) or []
    ckm = salt.utils.minions.CkMinions(__opts__)
    allowed = {}
    for minion in minions or []:
        if not isinstance(minion, str) or not minion:
            continue
        # minions=[minion]: the target is exactly this minion id, never a
        # pattern; the master checks it is among those the entry matches.
        allowed[minion] = bool(
            ckm.auth_check(auth_list, NODE_FUNCTION, [], minion, "list", minions=[minion])
        )
    return {"user": user, "eauth": eauth, "groups": groups, "allowed": allowed, "grants": _grants(auth_list)}
