#!/bin/sh
# thawd.toml(5) from the commented default configuration (packaging/thawd.toml): its header
# comment is the description, each [table] a subsection, each key with the comment above it
# an entry showing its default. Output is a function of the input alone (reproducible).
# usage: thawd.toml.5.sh packaging/thawd.toml VERSION
set -e
toml=$1 version=$2
cat <<HEAD
.TH THAWD.TOML 5 "" "thaw $version" "thaw"
.SH NAME
thawd.toml \- configuration of thawd, the thaw node daemon
.SH SYNOPSIS
.I /etc/thaw/thawd.toml
.SH DESCRIPTION
HEAD
awk '
  function esc(s) { gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s); if (s ~ /^[.\x27]/) s = "\\&" s; return s }
  function flush() { if (text != "") { print text; text = "" } }
  BEGIN { header = 1 }
  /^# \/etc\/thaw\/thawd.toml/ { sub(/^# \/etc\/thaw\/thawd.toml — thawd.s configuration\. */, ""); text = esc($0); next }
  header && /^#/ { sub(/^# ?/, ""); text = text (text == "" ? "" : "\n") esc($0); next }
  header && /^$/ { flush(); header = 0; print ".SH OPTIONS"; next }
  /^\[/ { flush(); t = $0; gsub(/[\[\]]/, "", t); print ".SS \"[" t "]\""; next }
  /^# *[a-z_]+ = / {
    cm = $0; sub(/^# */, "", cm); key = cm; sub(/ *=.*/, "", key); v = esc(cm); gsub(/"/, "\"\"", v)
    print ".TP\n.B \"" esc(key) "\""; flush()
    print "Not set by default. For example:\n.RS\n.B \"" v "\"\n.RE"; next }
  /^#/ { sub(/^# ?/, ""); text = text (text == "" ? "" : "\n") esc($0); next }
  /^[a-z_]+ *=/ {
    key = $0; sub(/ *=.*/, "", key); val = $0; sub(/^[^=]*= */, "", val)
    v = esc(val); gsub(/"/, "\"\"", v)
    print ".TP\n.B \"" esc(key) " = " v "\""
    flush(); next }
  /^$/ { flush() }
  END { flush() }
' "$toml"
cat <<'TAIL'
.SH FILES
.TP
.I /etc/thaw/thawd.toml
read by thawd at start (\-\-config chooses another file); thawd \-\-check\-config validates it
.SH SEE ALSO
.BR thawd (8),
.BR thawctl (1),
.BR thaw\-coordinator (8)
TAIL
