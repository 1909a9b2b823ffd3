#!/usr/bin/env bash
# Prints today's Azure retail prices (USD/hour, Linux, pay-as-you-go and Spot) of the VM sizes the
# examples use, from Azure's public Retail Prices API (no login needed), and the hourly cost of
# each example's VMs. Usage: terraform/scripts/prices.sh [region] [node_count]
# Needs curl, jq and awk. Disks (Premium SSD v2) are billed per GiB/IOPS/MBps-month: see README.
set -euo pipefail
REGION=${1:-eastus}
NODES=${2:-4}
API="https://prices.azure.com/api/retail/prices"
price() { # $1 = sku, $2 = "spot" or "ondemand"; prints USD/hour
  local filter="serviceName eq 'Virtual Machines' and armRegionName eq '$REGION' and armSkuName eq '$1' and priceType eq 'Consumption'"
  curl -sfG "$API" --data-urlencode "\$filter=$filter" |
    jq -r --arg kind "$2" '[.Items[]
      | select((.productName | test("Windows")) | not)
      | select(.skuName | test("Low Priority") | not)
      | select(if $kind == "spot" then (.skuName | test("Spot")) else (.skuName | test("Spot") | not) end)
      | .retailPrice] | min // "n/a"'
}
echo "region $REGION, $(date -u +%F)"
for sku in Standard_E96ps_v6 Standard_E16ps_v6; do
  printf '%-20s on-demand %8s  spot %8s  USD/h\n' "$sku" "$(price "$sku" ondemand)" "$(price "$sku" spot)"
done
e96=$(price Standard_E96ps_v6 ondemand); e96s=$(price Standard_E96ps_v6 spot)
e16=$(price Standard_E16ps_v6 ondemand); e16s=$(price Standard_E16ps_v6 spot)
echo "single-vm-numa (1 x E96ps_v6):          on-demand $e96  spot $e96s USD/h (+ disks)"
times() { awk -v p="$1" -v n="$2" 'BEGIN { if (p == "n/a") print "n/a"; else printf "%.4f", p * n }'; }
echo "multi-vm (1 + $NODES x E16ps_v6):           on-demand $(times "$e16" $((NODES + 1)))  spot $(times "$e16s" $((NODES + 1))) USD/h (+ disks)"
