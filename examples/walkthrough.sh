#!/usr/bin/env bash
# From an empty server to booked GPUs, a node reservation sold twice, spot work reclaimed
# and an agent approved by a person. Run it from the repository's root with ORL_URL and
# ORL_KEY (the admin key) set, or type its commands one by one.
set -euo pipefail

orl status

# A provider that owns GPU nodes, a tenant that books them, and an org holding a
# long-term contract; a key for each that acts for it.
orl orgs create acme-gpu --name "Acme GPU"
orl orgs create tenant-a --name "Tenant A"
orl orgs create tenant-b --name "Tenant B"
PROVIDER_KEY=$(orl keys create acme-gpu --role provider --field key)
TENANT_KEY=$(orl keys create tenant-a --role member --field key)

# The provider registers its nodes: one from its inventory file, two more from one file.
ORL_KEY=$PROVIDER_KEY orl nodes put acme-gpu h100-1 --file examples/inventory.json
ORL_KEY=$PROVIDER_KEY orl nodes import acme-gpu --file examples/nodes.json
orl nodes list acme-gpu

# A long-term contract: the second NVLink domain of h100-1 is reserved for tenant-b, and
# acme-gpu may manage it. The provider sells two of its units on the spot market.
NR=$(orl reservations create h100-1 --unit-ids h100-1-gpu4,h100-1-gpu5,h100-1-gpu6,h100-1-gpu7 \
    --allowed-org-ids tenant-b --managing-org-ids acme-gpu --contract-ref msa-7 --field id)
ORL_KEY=$PROVIDER_KEY orl reservations unit release h100-1 "$NR" --unit-ids h100-1-gpu6,h100-1-gpu7
orl reservations org tenant-b

# A pool of h100-1, offered to tenant-a: up to 16 GPUs at 2.50 per GPU-hour.
orl pools create --name h100 --owner acme-gpu --node-ids h100-1
orl pools offer h100 --tenant tenant-a --quota gpu=16 --price-per-gpu-hour 250

# tenant-a books 4 GPUs in one NVLink domain for 2 hours (request.json): the first
# domain, the only one open to it. Then 2 spot GPUs: the released units.
RSV=$(ORL_KEY=$TENANT_KEY orl compute reservations create --request-file examples/request.json --field id)
SPOT=$(ORL_KEY=$TENANT_KEY orl compute reservations create --tenant tenant-a --pool h100 --gpus 2 \
    --spot --duration 8h --idempotency-key spot-1 --field id)
ORL_KEY=$TENANT_KEY orl compute reservations list --tenant tenant-a
orl catalog tenant-a

# tenant-b needs its units back. What would go (the provider's view, then the
# reservation's), then the reclaim: the spot work ends with reason capacity-reclaim.
ORL_KEY=$PROVIDER_KEY orl provider spot-workload reclaim h100-1 --dry-run
orl reservations unit reclaim h100-1 "$NR" --unit-ids h100-1-gpu6,h100-1-gpu7 --dry-run
ORL_KEY=$PROVIDER_KEY orl reservations unit reclaim h100-1 "$NR" \
    --unit-ids h100-1-gpu6,h100-1-gpu7 --reason "tenant-b starts training"
ORL_KEY=$TENANT_KEY orl compute reservations get --tenant tenant-a "$SPOT"

# The pool grows to all three nodes.
orl pools set-nodes h100 --node-ids h100-1,h100-2,h100-3

# tenant-a's IAM policy (policy.cedar): agents book small requests alone, bigger ones
# once a person approves. `get` prints the policy exactly as it was set.
orl iam policy set tenant-a --file examples/policy.cedar
orl iam policy get tenant-a
AGENT_KEY=$(orl keys create tenant-a --role member --agent --field key)
ORL_KEY=$AGENT_KEY orl compute reservations create --tenant tenant-a --pool h100 --gpus 8 \
    --model H100-SXM5-80GB --duration 4h --idempotency-key agent-8 || echo "waits for a person"
CONFIRMATION=$(ORL_KEY=$TENANT_KEY orl confirmations list tenant-a --field items.0.id)
ORL_KEY=$TENANT_KEY orl confirmations approve tenant-a "$CONFIRMATION"
ORL_KEY=$AGENT_KEY orl compute reservations create --tenant tenant-a --pool h100 --gpus 8 \
    --model H100-SXM5-80GB --duration 4h --idempotency-key agent-8

# tenant-a keeps its first reservation an hour longer, then lets it go.
ORL_KEY=$TENANT_KEY orl compute reservations extend --tenant tenant-a "$RSV" --by 1h
ORL_KEY=$TENANT_KEY orl compute reservations release --tenant tenant-a "$RSV"

# What the provider earned so far, the contract ended, and what happened, newest first.
ORL_KEY=$PROVIDER_KEY orl provider earnings
orl reservations end h100-1 "$NR" --reason "contract over"
orl audit --org acme-gpu --limit 20
