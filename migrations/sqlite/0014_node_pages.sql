-- Node lists and the catalog page by node id: an org's nodes in id order, and the pools a
-- node belongs to, found from the node.
DROP INDEX nodes_org;
CREATE INDEX nodes_org ON nodes (org_id, id);
CREATE INDEX pool_nodes_node ON pool_nodes (node_id);
