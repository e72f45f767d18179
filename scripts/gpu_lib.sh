# Shared by scripts/gpu_run.sh and scripts/gpu_lease.sh (sourced).
# gpu_status_table LOGS WIDTH: the report's table of steps from LOGS/*.status (NAME|VERDICT|SECONDS|COMMAND),
# oldest first, the command cut to WIDTH characters
gpu_status_table() {
  local f n v t c
  echo "| step | result | seconds | command |"
  echo "| --- | --- | --- | --- |"
  for f in $(ls -tr "$1"/*.status 2>/dev/null); do
    IFS='|' read -r n v t c < "$f"
    echo "| $n | $v | $t | \`$(echo "$c" | cut -c1-"$2")\` |"
  done
}
