#!/usr/bin/env bash
# Prints users.acl (or the ACL file `toolnexus acl` wrote) with a password for each
# toolnexus user, as a SHA-256 hash (#<hex>): no password is written anywhere, not even
# to the ACL file.
#
#   REDIS_AGENT_PASSWORD=... REDIS_RESPONDER_PASSWORD=... REDIS_OPS_PASSWORD=... \
#     deploy/redis/set-passwords.sh [users.acl] > /etc/redis/users.acl
#
# Each password comes from REDIS_<USER>_PASSWORD, or from the file named by
# REDIS_<USER>_PASSWORD_FILE (a Docker or Kubernetes secret), <USER> in upper case with
# '-' as '_' (agent-7: REDIS_AGENT_7_PASSWORD). Users other than default need one; the
# default user stays off.
set -euo pipefail

source_file=${1:-"$(dirname "$0")/users.acl"}
out=""
while read -r keyword user rules; do
  [ -n "$keyword" ] || continue
  if [ "$keyword" != user ]; then
    echo "set-passwords.sh: $source_file: expected 'user NAME RULES...', got '$keyword'" >&2
    exit 1
  fi
  if [ "$user" = default ]; then
    out+="user $user $rules"$'\n'
    continue
  fi
  var="REDIS_${user^^}_PASSWORD"
  var=${var//-/_}
  file_var="${var}_FILE"
  if [ -n "${!file_var:-}" ]; then
    password=$(<"${!file_var}")
  else
    password=${!var:-}
  fi
  if [ -z "$password" ]; then
    echo "set-passwords.sh: no password for user '$user': set $var or $file_var" >&2
    exit 1
  fi
  hash=$(printf '%s' "$password" | sha256sum | cut -d' ' -f1)
  out+="user $user $rules #$hash"$'\n'
done <"$source_file"
printf '%s' "$out"
