"""The Grafana dashboard shipped in the Helm chart, read and drawn without Grafana.

``promql`` turns the dashboard's queries into plain PromQL and asks a Prometheus server;
``render`` draws every panel to one PNG, so a change to the dashboard or to a metric can be
seen (and tested) on a machine with nothing but Prometheus.
"""
