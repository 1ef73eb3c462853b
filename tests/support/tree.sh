#!/bin/sh
# Builds a process tree for kill-tree tests and benchmarks; every member
# appends its pid to PIDFILE as it starts. Usage: tree.sh idle|forking|daemons PIDFILE
#   idle:    root -> 4 shells -> 5 sleepers each (25 processes, 3 levels)
#   forking: root -> 3 shells that each start a new sleeper every 50 ms, forever
#   daemons: root -> 3 shells, each with a sleeper and 2 double-forked setsid daemons
kind=$1
pidfile=$2
echo $$ >> "$pidfile"
case "$kind" in
idle)
  for i in 1 2 3 4; do
    sh -c 'echo $$ >> "$1"; for j in 1 2 3 4 5; do sleep 1000 & echo $! >> "$1"; done; wait' _ "$pidfile" &
  done ;;
forking)
  for i in 1 2 3; do
    sh -c 'echo $$ >> "$1"; while :; do sleep 1000 & echo $! >> "$1"; sleep 0.05; done' _ "$pidfile" &
  done ;;
daemons)
  for i in 1 2 3; do
    sh -c 'echo $$ >> "$1"
           sleep 1000 & echo $! >> "$1"
           for d in 1 2; do (setsid sleep 1000 & echo $! >> "$1"); done
           wait' _ "$pidfile" &
  done ;;
*)
  echo "tree.sh: unknown tree kind '$kind'" >&2
  exit 2 ;;
esac
wait
