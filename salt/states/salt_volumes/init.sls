{#- Every volume in pillar salt_volumes:volumes whose node is this minion. #}
include:
  - salt_volumes.prepared
